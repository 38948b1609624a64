/* Turns: a queued prompt claimed by its session, the provider found for it, the provider's sink (deltas,
 * commits, tool calls, questions, subagents, the end), the tools a turn runs under the session's policy, and
 * the turn's end, always its last event.
 */
#include <stdlib.h>
#include <string.h>

#include "../hooks.h"
#include "session.h"

#define HISTORY_MAX 200
#define HISTORY_WINDOW 2000 /* events read to build the history */

static void on_turn_token(ah_cancel *token, void *arg);
static void tools_gathered(const json_t *tools, const json_t *notices, void *arg);
static void finish_pending_end(turn *t);

/* The provider of the configured [provider.NAME]: the embedded echo for type echo (and the built-in
 * "echo"), else the provider type a mounted plugin registered (acp, openai, …), with its mount in *mount.
 * NULL when the name is not configured or no active mount provides its type. */
ah_provider *ah__turn_provider(ah_sessions *m, const char *name, ah_mount **mount, const json_t **config) {
  if (mount)
    *mount = NULL;
  const ah_config *cfg = ah__host_config(m->host);
  const json_t *p = cfg && name ? json_object_get(cfg->providers, name) : NULL;
  if (config)
    *config = p;
  if (!name || strcmp(name, "echo") == 0)
    return m->echo;
  const char *type = p ? str(p, "type") : NULL;
  if (!type)
    return NULL;
  if (strcmp(type, "echo") == 0)
    return m->echo;
  return ah__registry_provider(&m->host->reg, type, mount);
}

/* The end of a turn whose provider's plugin is withdrawn: a host that stops cancels its turns (as
 * ah__sessions_stop does); an unload is a failure of the turn. */
static void turn_end_provider_gone(turn *t, json_t *usage) {
  if (t->s->m->host->stopping)
    ah__turn_end(t, "cancelled", usage, NULL);
  else
    ah__turn_end(t, "error", usage, "the provider's plugin was withdrawn during the turn");
}

void ah__sessions_provider_withdrawn(ah_sessions *m, ah_mount *mount) {
  /* Before the plugin's withdraw() runs: every turn on one of its providers is cancelled and its provider
   * turn freed now (the plugin may finish reclaiming children before its withdraw completes). The provider
   * may still commit what it has while cancelling; the turn's end is recorded by the core. Ended turns
   * waiting for their posted free lose only their provider turn. */
  if (!m)
    return;
  ah__link *it = m->turns.next;
  while (it != &m->turns) {
    turn *t = AH__CONTAINER(it, turn, all);
    it = it->next;
    if (t->prov_mount != mount || !t->pt)
      continue;
    if (!t->ended && !t->end_pending) {
      t->provider_gone = true;
      t->cancelled = true;
      if (t->pending)
        ah__request_resolve(t->pending, "cancelled", NULL, NULL, NULL);
      t->prov->turn_cancel(t->pt);
    }
    ah_provider_turn *pt = t->pt;
    t->pt = NULL;
    t->prov->turn_free(pt);
    if (!t->ended && !t->end_pending)
      turn_end_provider_gone(t, NULL);
  }
}

static json_t *history_for(const json_t *page, const char *current_message, bool with_tools) {
  /* The conversation so far as the provider sees it, from `page` (the recent window of the session's
   * events, read before the turn started: gather_tools): each earlier turn's user message (in the order
   * the turns started) and the committed assistant messages, the last HISTORY_MAX of them; with_tools,
   * also each tool call with its result (a call without a recorded result is left out). Prompts still
   * queued are not part of it. */
  json_t *hist = json_array();
  json_t *prompts = json_object(); /* messageId -> content, from inbox/received */
  json_t *results = json_object(); /* callId -> its tool/result data */
  size_t i = 0;
  json_t *ev = NULL;
  if (with_tools) {
    json_array_foreach(page, i, ev) {
      json_t *data = json_object_get(ev, "data");
      if (strcmp(str(ev, "kind"), "tool/result") == 0 && str(data, "callId"))
        json_object_set(results, str(data, "callId"), data);
    }
  }
  json_array_foreach(page, i, ev) {
    const char *kind = str(ev, "kind");
    const char *mid = str(ev, "messageId");
    json_t *data = json_object_get(ev, "data");
    if (strcmp(kind, "inbox/received") == 0 && mid) {
      json_object_set(prompts, mid, json_object_get(data, "content"));
    } else if (strcmp(kind, "turn/started") == 0 && mid && strcmp(mid, current_message) != 0 &&
               json_object_get(prompts, mid)) {
      json_array_append_new(
          hist, json_pack("{s:s, s:O}", "role", "user", "content", json_object_get(prompts, mid)));
    } else if (strcmp(kind, "message/committed") == 0) {
      json_array_append_new(
          hist, json_pack("{s:s, s:O}", "role", "assistant", "text", json_object_get(data, "text")));
    } else if (with_tools && strcmp(kind, "tool/call") == 0 && str(data, "callId")) {
      if (!json_object_get(results, str(data, "callId")))
        continue;
      json_array_append_new(
          hist, json_pack("{s:s, s:s, s:s, s:O}", "role", "tool_call", "callId", str(data, "callId"), "name",
                          str(data, "name") ? str(data, "name") : "", "args", json_object_get(data, "args")));
    } else if (with_tools && strcmp(kind, "tool/result") == 0 && str(data, "callId")) {
      json_array_append_new(hist,
                            json_pack("{s:s, s:s, s:s, s:O, s:b}", "role", "tool_result", "callId",
                                      str(data, "callId"), "name", str(data, "name") ? str(data, "name") : "",
                                      "result", json_object_get(data, "result"), "isError",
                                      json_is_true(json_object_get(data, "isError"))));
    }
  }
  json_decref(prompts);
  json_decref(results);
  while (json_array_size(hist) > HISTORY_MAX)
    json_array_remove(hist, 0);
  /* A cut must not leave a tool result without its call first. */
  while (json_array_size(hist) > 0 && strcmp(str(json_array_get(hist, 0), "role"), "tool_result") == 0)
    json_array_remove(hist, 0);
  return hist;
}

static const json_t *sink_history(void *ctx) {
  turn *t = ctx;
  if (!t->history) {
    const ah_provider *p = t->prov;
    bool tools = p && AH_HAS_FIELD(p, ah_provider, flags) && (p->flags & AH_PROVIDER_TOOL_HISTORY);
    t->history = history_for(t->history_page, t->message_id, tools);
  }
  return t->history;
}

static void turn_free(turn *t) {
  ah__list_remove(&t->all);
  if (t->pt && t->prov)
    t->prov->turn_free(t->pt);
  ah__cancel_free(t->cancel);
  free(t->message_id);
  json_decref(t->content);
  json_decref(t->last_text);
  free(t->child_message);
  free(t->end_reason);
  free(t->end_error);
  json_decref(t->end_usage);
  json_decref(t->history);
  json_decref(t->history_page);
  json_decref(t->tools);
  free(t);
}

/* A stopping manager waits for every turn's free (the provider's turn with it: echo's handles must be
 * closed before the core goes). */
static void turn_free_task(void *arg) {
  ah_sessions *m = ((turn *)arg)->m;
  turn_free(arg);
  ah__sm_check_stopped(m);
}

static void ended_written(session *s, int status, const json_t *event, void *arg) {
  (void)status;
  (void)event;
  (void)arg;
  s->end_unwritten = false;
  if (!s->lost && !s->broken) /* a lost or broken session runs nothing more here */
    ah__turn_claim(s);
}

void ah__turn_end(turn *t, const char *reason, json_t *usage, const char *error) {
  if (t->ended || t->end_pending) {
    json_decref(usage);
    return;
  }
  if (t->tools_running > 0) {
    t->end_pending = true;
    t->end_reason = strdup(reason);
    t->end_usage = usage;
    t->end_error = ah__strdup(error);
    if (t->gathering) /* the tool sources are asked to stop listing at once */
      ah__cancel_trip(t->cancel);
    return;
  }
  t->ended = true;
  session *s = t->s;
  if (t->pending)
    ah__request_resolve(t->pending, "cancelled", NULL, NULL, NULL);
  if (t->child && t->child->turn)
    ah__cancel_trip(t->child->turn->cancel);
  json_t *data = json_pack("{s:s, s:o}", "reason", reason, "usage",
                           usage ? usage : json_pack("{s:i, s:i}", "inputTokens", 0, "outputTokens", 0));
  if (error)
    json_object_set_new(data, "error", json_string(error));
  if (t->requested_model[0])
    json_object_set_new(data, "requestedModel", json_string(t->requested_model));
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:s}]", "op", "inbox.state", "messageId", t->message_id, "state",
                          "done", "turnId", t->id);
  /* The session's totals: one more turn, and the end's usage only when no round trip was reported (they
   * were counted as they came). A usage of several models (`models`) is not attributed to one. */
  const json_t *u = json_object_get(data, "usage");
  const json_t *models = json_object_get(u, "models");
  const char *model = json_array_size(models) > 1 ? NULL : str(u, "model");
  json_t *acc = ah__usage_account(s, model, t->rounds ? NULL : u, true);
  if (acc)
    json_array_append_new(ops, acc);
  s->end_unwritten = true;
  json_t *doc = NULL;
  if (!s->m->stopping && !s->lost && !s->broken && ah__hooks_any(s->m->host, "turn_end", NULL)) {
    doc = ah__hook_doc(s, t);
    json_object_set_new(
        doc, "turn",
        json_pack("{s:s, s:s, s:s?}", "reason", reason, "messageId", t->message_id, "error", error));
  }
  ah__write_ops(s, ops, "turn/ended", t->id, t->message_id, data, ended_written, NULL);
  s->turn = NULL;
  if (doc && ah__session_hooks(s, "turn_end", doc, NULL, NULL) < 0)
    AH_LOG_W(LOG, "session %s: the turn_end hooks could not run: out of memory", s->id);
  /* A subagent's parent learns the end of the turn it waits for. */
  if (s->parent_turn && s->parent_message && strcmp(s->parent_message, t->message_id) == 0)
    ah__subagent_notify_parent(s, t->message_id, reason, json_string_value(t->last_text));
  /* The provider's turn is freed on a later pass: it may be calling us from its own callback. */
  ah__services_post(s->m->core, turn_free_task, t);
  if (s->lost || s->broken) { /* nothing more runs here; the memory goes once nothing uses it */
    ah__live_free_if_unused(s);
    return;
  }
  if (s->closing) {
    ah__live_finish_close(s);
    return;
  }
  if (ah__list_empty(&s->queue) || s->m->stopping)
    ah__write_running(s, false);
  if (s->m->stopping)
    ah__sm_check_stopped(s->m);
  else
    ah__turn_claim(s);
}

/* Sink: what the provider reports. ctx is the turn. */

static void sink_delta(void *ctx, const char *text) {
  turn *t = ctx;
  if (t->ended)
    return;
  ah__sm_emit(t->s->m, "session.delta",
              json_pack("{s:s, s:s, s:s, s:s}", "sessionId", t->s->id, "turnId", t->id, "messageId",
                        t->message_id, "text", text ? text : ""));
}

static void sink_reasoning(void *ctx, const char *text) {
  turn *t = ctx;
  if (t->ended || !text)
    return;
  ah__sm_emit(t->s->m, "session.reasoning",
              json_pack("{s:s, s:s, s:s, s:s}", "sessionId", t->s->id, "turnId", t->id, "messageId",
                        t->message_id, "text", text));
}

static void sink_usage(void *ctx, const json_t *round) {
  turn *t = ctx;
  if (t->ended || !json_is_object(round))
    return;
  const char *model = str(round, "model");
  json_t *data = json_pack("{s:i, s:o}", "round", ++t->rounds, "usage", json_deep_copy(round));
  json_t *u = json_object_get(data, "usage");
  if (!json_object_get(u, "requests")) /* one report is one round trip */
    json_object_set_new(u, "requests", json_integer(1));
  if (t->requested_model[0])
    json_object_set_new(data, "requestedModel", json_string(t->requested_model));
  /* attributed to the model the server reported, never guessed from the one asked for */
  json_t *acc = ah__usage_account(t->s, model, u, false);
  ah__write_ops(t->s, acc ? json_pack("[o]", acc) : NULL, "model/usage", t->id, NULL, data, NULL, NULL);
}

static void sink_notice(void *ctx, const json_t *note) {
  turn *t = ctx;
  if (t->ended || !json_is_object(note) || !json_is_string(json_object_get(note, "kind")))
    return;
  ah__write_event(t->s, "turn/notice", t->id, NULL, json_deep_copy(note));
}

/* `text` (a JSON string, stolen) is stored, emitted and kept for a waiting parent as this one value: a long
 * message is never copied on the loop. */
static void sink_commit_json(void *ctx, json_t *text) {
  turn *t = ctx;
  if (t->ended || !json_is_string(text)) {
    json_decref(text);
    return;
  }
  json_decref(t->last_text);
  t->last_text = json_incref(text);
  ah__write_event(t->s, "message/committed", t->id, NULL,
                  json_pack("{s:s, s:o}", "role", "assistant", "text", text));
}

static void sink_commit(void *ctx, const char *text) {
  turn *t = ctx;
  if (t->ended)
    return;
  json_t *v = json_string(text ? text : "");
  if (!v) /* not UTF-8: what is stored says so (jansson holds only UTF-8 strings) */
    v = json_string("(the provider committed text that is not UTF-8)");
  sink_commit_json(ctx, v);
}

static void sink_end(void *ctx, const char *reason, const json_t *usage, const char *error) {
  turn *t = ctx;
  static const char *const reasons[] = {"end", "max-tokens", "cancelled", "error", "refusal"};
  bool known = false;
  for (size_t i = 0; reason && i < sizeof reasons / sizeof reasons[0]; i++)
    known = known || strcmp(reason, reasons[i]) == 0;
  if (!known) {
    ah__turn_end(t, "error", usage ? json_deep_copy(usage) : NULL,
                 "the provider ended the turn with an unknown reason");
    return;
  }
  if (t->provider_gone) {
    turn_end_provider_gone(t, usage ? json_deep_copy(usage) : NULL);
    return;
  }
  /* A turn the user cancelled ends `cancelled` whatever the provider says afterwards. */
  ah__turn_end(t, t->cancelled ? "cancelled" : reason, usage ? json_deep_copy(usage) : NULL, error);
}

typedef struct tool_run {
  turn *t;
  char *call_id;
  char *name;
  json_t *args;
  bool is_error; /* while the after_tool hooks run: the result they see */
  json_t *result;
  json_t *old_text; /* write_file: the file's text before the write (null: a new file), stored as oldText */
} tool_run;

static void tool_run_free(tool_run *r) {
  free(r->call_id);
  free(r->name);
  json_decref(r->args);
  json_decref(r->result);
  json_decref(r->old_text);
  free(r);
}

static void finish_pending_end(turn *t) {
  if (t->end_pending && t->tools_running == 0) {
    t->end_pending = false;
    char *reason = t->end_reason;
    char *error = t->end_error;
    json_t *usage = t->end_usage;
    t->end_reason = t->end_error = NULL;
    t->end_usage = NULL;
    ah__turn_end(t, reason, usage, error);
    free(reason);
    free(error);
  }
}

/* The result is stored and, while the turn goes on, handed to the provider. */
static void tool_finish(tool_run *r, const json_t *result, bool is_error) {
  turn *t = r->t;
  if (!is_error && strcmp(r->name, "update_plan") == 0) /* the plan, for every surface to show */
    ah__write_event(
        t->s, "plan/updated", t->id, NULL,
        json_pack("{s:s, s:O}", "callId", r->call_id, "entries", json_object_get(r->args, "entries")));
  json_t *data = json_pack("{s:s, s:s, s:O, s:b}", "callId", r->call_id, "name", r->name, "result", result,
                           "isError", is_error);
  if (data && r->old_text)
    json_object_set(data, "oldText", r->old_text);
  ah__write_event(t->s, "tool/result", t->id, NULL, data);
  bool deliver = !t->ended && !t->cancelled && !t->end_pending;
  if (deliver)
    t->prov->turn_tool_result(t->pt, r->call_id, result, is_error);
  tool_run_free(r);
  finish_pending_end(t);
}

/* What the after_tool hooks said goes to the model with the result: `hookNotes` [string] beside an
 * object's keys, else {result, hookNotes}. */
static void after_hooked(turn *t, const ah_hook_verdict *v, void *arg) {
  (void)t;
  tool_run *r = arg;
  json_t *notes = json_copy((json_t *)v->context);
  if (v->deny && !v->cancelled) {
    char *why = ah__hook_denial(v);
    if (why)
      json_array_append_new(notes, json_string(why));
    free(why);
  }
  json_t *result = NULL;
  if (json_array_size(notes) == 0) {
    result = json_incref(r->result);
  } else if (json_is_object(r->result)) {
    result = json_copy(r->result);
    json_object_set(result, "hookNotes", notes);
  } else {
    result = json_pack("{s:O, s:O}", "result", r->result, "hookNotes", notes);
  }
  json_decref(notes);
  tool_finish(r, result ? result : r->result, r->is_error);
  json_decref(result);
}

static void tool_done(const json_t *result, bool is_error, void *arg) {
  tool_run *r = arg;
  turn *t = r->t;
  t->tools_running--;
  json_t *clean = NULL; /* write_file's result without the text before the write */
  if (!is_error && strcmp(r->name, "write_file") == 0 && json_object_get(result, AH_TOOL_PREVIOUS)) {
    r->old_text = json_incref(json_object_get(result, AH_TOOL_PREVIOUS));
    clean = json_copy((json_t *)result);
    json_object_del(clean, AH_TOOL_PREVIOUS);
    result = clean;
  }
  bool going_on = !t->ended && !t->cancelled && !t->end_pending;
  if (going_on && ah__hooks_any(t->m->host, "after_tool", r->name)) {
    json_t *doc = ah__hook_doc(t->s, t);
    json_object_set_new(doc, "tool",
                        json_pack("{s:s, s:s, s:O, s:O, s:b}", "name", r->name, "callId", r->call_id,
                                  "arguments", r->args, "result", result, "isError", is_error));
    r->result = json_incref((json_t *)result);
    r->is_error = is_error;
    if (ah__turn_hooks(t, "after_tool", r->name, r->call_id, doc, after_hooked, r) == 1) {
      json_decref(clean);
      return;
    }
    json_decref(r->result);
    r->result = NULL;
  }
  tool_finish(r, result, is_error);
  json_decref(clean);
}

/* A tool's progress is transient, like a delta: emitted for the clients watching, not stored. */
static void tool_progress(const json_t *progress, void *arg) {
  tool_run *r = arg;
  turn *t = r->t;
  if (t->ended)
    return;
  json_t *ev = json_pack("{s:s, s:s, s:s, s:s}", "sessionId", t->s->id, "turnId", t->id, "callId", r->call_id,
                         "name", r->name);
  json_object_update_missing(ev, (json_t *)progress);
  ah__sm_emit(t->s->m, "session.progress", ev);
}

void ah__turn_tool_refused(turn *t, const char *call_id, const char *name, const char *why) {
  json_t *res = json_pack("{s:s}", "error", why);
  ah__write_event(
      t->s, "tool/result", t->id, NULL,
      json_pack("{s:s, s:s, s:O, s:b}", "callId", call_id, "name", name, "result", res, "isError", 1));
  if (!t->ended && t->pt)
    t->prov->turn_tool_result(t->pt, call_id, res, true);
  json_decref(res);
}

void ah__turn_run_tool(turn *t, const char *call_id, const char *name, const json_t *args) {
  tool_run *r = calloc(1, sizeof *r);
  if (!r) {
    ah__turn_tool_refused(t, call_id, name, "out of memory");
    return;
  }
  r->t = t;
  r->call_id = strdup(call_id);
  r->name = strdup(name);
  r->args = json_incref((json_t *)args);
  const ah__tool_editor ed = {.read = t->s->editor.read,
                              .write = t->s->editor.write,
                              .run = t->s->editor.run,
                              .turn_id = t->id,
                              .call_id = call_id};
  int rc =
      ah__tool_run_edited(t->s->m->host, t->s->id, str(t->s->row, "cwd"), name, args,
                          ed.read || ed.write || ed.run ? &ed : NULL, t->cancel, tool_progress, tool_done, r);
  if (rc) {
    tool_run_free(r);
    ah__turn_tool_refused(t, call_id, name,
                          rc == AH_EINVAL ? "invalid arguments for this tool" : ah_strerror(rc));
    return;
  }
  t->tools_running++;
}

/* The offered tool named `name` (NULL when not offered). */
static const json_t *offered(turn *t, const char *name) {
  size_t i;
  json_t *tool;
  json_array_foreach(t->tools, i, tool) {
    if (name && strcmp(str(tool, "name"), name) == 0)
      return tool;
  }
  return NULL;
}

static const char *kind_of(turn *t, const char *name) {
  const char *k = str(offered(t, name), "kind");
  return k ? k : "other";
}

/* What the session's policy and mode say of a tool (docs/sessions.md "Modes"): a tool's own `deny` always
 * holds; read_only refuses every tool that does more than read (`why` says so); accept_edits allows edits. */
static const char *policy_of(turn *t, const char *tool, const char **why) {
  session *s = t->s;
  const char *p = str(json_object_get(s->row, "policy"), tool);
  if (!p)
    p = ah__tool_policy(s->m->host, tool);
  if (why)
    *why = "denied by the session's policy";
  if (!p || strcmp(p, "deny") == 0)
    return "deny";
  const char *mode = ah__session_mode_of(s->m, s->row);
  const char *kind = kind_of(t, tool);
  if (strcmp(mode, "read_only") == 0 && strcmp(kind, "read") != 0 && strcmp(kind, "search") != 0 &&
      strcmp(kind, "think") != 0 && strcmp(kind, "fetch") != 0) {
    if (why)
      *why = "the session is in read-only mode: only tools that read may run";
    return "deny";
  }
  if (strcmp(mode, "accept_edits") == 0 && strcmp(kind, "edit") == 0)
    return "allow";
  return p;
}

/* After the before_tool hooks: run it, or ask first, as the session's policy says. */
static void run_or_ask(turn *t, const char *call_id, const char *name, const json_t *args) {
  const char *policy = policy_of(t, name, NULL);
  if (strcmp(policy, "allow") == 0) {
    ah__turn_run_tool(t, call_id, name, args);
    return;
  }
  if (t->pending) {
    ah__turn_tool_refused(t, call_id, name, "another request is already waiting for an answer");
    return;
  }
  request *r =
      ah__request_new(t, "approval",
                      json_pack("{s:s, s:s, s:O, s:s}", "tool", name, "callId", call_id, "args",
                                args ? args : json_null(), "cwd", str(t->s->row, "cwd")),
                      json_pack("[s,s,s,s]", "allow_once", "allow_always", "reject_once", "reject_always"));
  if (!r) {
    ah__turn_tool_refused(t, call_id, name, "out of memory");
    return;
  }
  r->call_id = strdup(call_id);
  r->tool = strdup(name);
  r->args = args ? json_deep_copy(args) : json_null();
}

typedef struct pending_call {
  turn *t;
  char *call_id;
  char *name;
  json_t *args;
} pending_call;

static void pending_call_free(pending_call *pc) {
  if (!pc)
    return;
  free(pc->call_id);
  free(pc->name);
  json_decref(pc->args);
  free(pc);
}

static void before_hooked(turn *t, const ah_hook_verdict *v, void *arg) {
  pending_call *pc = arg;
  if (t->ended || t->cancelled || t->end_pending || v->cancelled) {
    ah__turn_tool_refused(t, pc->call_id, pc->name, "cancelled");
  } else if (v->deny) {
    char *why = ah__hook_denial(v);
    ah__turn_tool_refused(t, pc->call_id, pc->name, why ? why : "denied by a hook");
    free(why);
  } else {
    run_or_ask(t, pc->call_id, pc->name, v->arguments ? v->arguments : pc->args);
  }
  pending_call_free(pc);
  finish_pending_end(t);
}

/* The tool/call event is stored: only now may the call have an effect (a prompt that is not stored yet, or a
 * call that could not be stored, never runs a tool). The policy, the before_tool hooks, then the run or the
 * approval, as the session's policy says. */
static void tool_call_written(session *s, int status, const json_t *event, void *arg) {
  (void)s;
  (void)event;
  pending_call *pc = arg;
  turn *t = pc->t;
  t->tools_running--;
  const char *call_id = pc->call_id, *name = pc->name;
  const json_t *args = pc->args;
  const json_t *tool = status == 0 ? offered(t, name) : NULL;
  const char *why = NULL;
  if (status != 0 || t->ended || t->cancelled || t->end_pending) {
    if (!t->ended)
      ah__turn_tool_refused(t, call_id, name, status != 0 ? "the call could not be stored" : "cancelled");
  } else if (!tool) {
    ah__turn_tool_refused(t, call_id, name, "unknown tool");
  } else if (strcmp(policy_of(t, name, &why), "deny") == 0) {
    ah__turn_tool_refused(t, call_id, name, why);
  } else if (ah__hooks_any(t->m->host, "before_tool", name)) {
    json_t *doc = ah__hook_doc(t->s, t);
    json_object_set_new(doc, "tool",
                        json_pack("{s:s, s:s, s:O}", "name", name, "callId", call_id, "arguments",
                                  args ? args : json_object()));
    int rc = ah__turn_hooks(t, "before_tool", name, call_id, doc, before_hooked, pc);
    if (rc == 1)
      return;   /* before_hooked frees pc */
    if (rc < 0) /* the hooks could not run: the call does not either */
      ah__turn_tool_refused(t, call_id, name, "the before_tool hooks could not run (out of memory)");
    else
      run_or_ask(t, call_id, name, args);
  } else {
    run_or_ask(t, call_id, name, args);
  }
  pending_call_free(pc);
  finish_pending_end(t);
}

static void sink_tool_call(void *ctx, const char *call_id, const char *name, const json_t *args) {
  turn *t = ctx;
  if (t->ended)
    return;
  const json_t *tool = offered(t, name);
  json_t *data = json_pack("{s:s, s:s, s:O, s:s?}", "callId", call_id, "name", name, "args",
                           args ? args : json_null(), "kind", str(tool, "kind"));
  pending_call *pc = calloc(1, sizeof *pc);
  if (pc) {
    pc->t = t;
    pc->call_id = strdup(call_id);
    pc->name = strdup(name);
    pc->args = args ? json_incref((json_t *)args) : json_object();
  }
  if (!pc || !pc->call_id || !pc->name) {
    ah__write_event(t->s, "tool/call", t->id, NULL, data);
    pending_call_free(pc);
    ah__turn_tool_refused(t, call_id, name, "out of memory");
    return;
  }
  t->tools_running++; /* until the call is stored: an end meanwhile waits for it */
  ah__write_ops(t->s, NULL, "tool/call", t->id, NULL, data, tool_call_written, pc);
}

static void sink_ask(void *ctx, const char *question, const json_t *options) {
  turn *t = ctx;
  if (t->ended)
    return;
  if (t->pending) {
    t->prov->turn_answer(t->pt, NULL, true);
    return;
  }
  request *r = ah__request_new(t, "question", json_pack("{s:s}", "question", question ? question : ""),
                               options ? json_deep_copy(options) : json_array());
  if (!r) {
    t->prov->turn_answer(t->pt, NULL, true);
    return;
  }
  ah__write_event(t->s, "question/asked", t->id, NULL,
                  json_pack("{s:s, s:s, s:O}", "requestId", r->id, "question", question ? question : "",
                            "options", r->options));
}

static void sink_subagent(void *ctx, const char *prompt) {
  turn *t = ctx;
  if (t->ended)
    return;
  int rc = 0;
  if (t->child) {
    t->prov->turn_subagent_result(t->pt, NULL, "error");
    return;
  }
  session *child = ah__subagent_start(t->s, t, prompt ? prompt : "", &rc);
  if (!child) {
    AH_LOG_W(LOG, "session %s: subagent refused: %s", t->s->id, ah_strerror(rc));
    ah__write_event(t->s, "agent/error", t->id, NULL,
                    json_pack("{s:s}", "message",
                              rc == AH_E2BIG ? "subagent depth limit reached" : "cannot start a subagent"));
    t->prov->turn_subagent_result(t->pt, NULL, "error");
  }
}

/* The prompt's text blocks, concatenated (what a hook matches on). New reference. */
static json_t *prompt_text(const json_t *content) {
  size_t n = 0, i;
  json_t *b;
  json_array_foreach(content, i, b) {
    if (str(b, "type") && strcmp(str(b, "type"), "text") == 0 && json_is_string(json_object_get(b, "text")))
      n += json_string_length(json_object_get(b, "text"));
  }
  char *buf = malloc(n + 1);
  size_t o = 0;
  json_array_foreach(content, i, b) {
    json_t *text = json_object_get(b, "text");
    if (buf && str(b, "type") && strcmp(str(b, "type"), "text") == 0 && json_is_string(text)) {
      memcpy(buf + o, json_string_value(text), json_string_length(text));
      o += json_string_length(text);
    }
  }
  json_t *out = buf ? json_stringn(buf, o) : json_string("");
  free(buf);
  return out;
}

static void gather_tools(turn *t);
static void start_provider(turn *t);
static void history_read(int status, const json_t *results, void *arg);

/* After the prompt_submit hooks: refused, or on with what they added as more text blocks of the prompt. */
static void prompt_hooked(turn *t, const ah_hook_verdict *v, void *arg) {
  (void)arg;
  if (t->end_pending) {
    finish_pending_end(t);
    return;
  }
  if (t->cancelled || v->cancelled) {
    ah__turn_end(t, "cancelled", NULL, NULL);
    return;
  }
  if (v->deny) {
    char *why = ah__hook_denial(v);
    ah__turn_end(t, "refusal", NULL, why ? why : "refused by a hook");
    free(why);
    return;
  }
  if (json_array_size(v->context) > 0 && json_is_array(t->content)) {
    json_t *more = json_copy(t->content);
    size_t i;
    json_t *c;
    json_array_foreach(v->context, i, c) { /* on a line of its own: a provider may join the blocks */
      json_t *text = json_sprintf("\n%s", json_string_value(c));
      if (text)
        json_array_append_new(more, json_pack("{s:s, s:o}", "type", "text", "text", text));
    }
    json_decref(t->content);
    t->content = more;
  }
  gather_tools(t);
}

void ah__turn_claim(session *s) {
  ah_sessions *m = s->m;
  if (!s->ready || s->closing || s->disposed || s->turn || s->end_unwritten || ah__list_empty(&s->queue) ||
      m->stopping)
    return;
  queued *q = AH__CONTAINER(s->queue.next, queued, link);
  ah__list_remove(&q->link);
  turn *t = calloc(1, sizeof *t);
  if (!t) {
    ah__list_push(&s->queue, &q->link);
    return;
  }
  ah__list_push(&m->turns, &t->all);
  t->s = s;
  t->m = m;
  ah__uuid7(t->id);
  t->message_id = q->message_id;
  t->content = q->content;
  free(q);
  /* A subagent's turn hangs below its parent's turn: cancelling the parent cancels it too. */
  t->cancel = ah__cancel_new(s->parent_turn ? s->parent_turn->cancel : NULL);
  if (!t->cancel || ah__cancel_watch(t->cancel, on_turn_token, t, NULL) != 0) {
    /* Out of memory (or a parent already cancelled): the turn ends at once, attributed to its message. */
    s->turn = t;
    ah__write_running(s, true);
    ah__turn_end(t, t->cancel ? "cancelled" : "error", NULL, t->cancel ? NULL : "out of memory");
    return;
  }
  s->turn = t;
  ah__write_running(s, true);
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:s}]", "op", "inbox.state", "messageId", t->message_id, "state",
                          "claimed", "turnId", t->id);
  ah__write_ops(s, ops, "inbox/claimed", t->id, t->message_id, json_object(), NULL, NULL);
  const char *prov_name = str(s->row, "provider");
  const char *model = str(s->row, "model");
  ah__write_event(s, "turn/started", t->id, t->message_id,
                  json_pack("{s:s, s:s?}", "provider", prov_name ? prov_name : "echo", "model", model));
  t->prov = ah__turn_provider(m, prov_name, &t->prov_mount, NULL);
  if (!t->prov) {
    ah__turn_end(t, "error", NULL, "the session's provider is not available");
    return;
  }
  if (ah__hooks_any(m->host, "prompt_submit", NULL)) {
    json_t *doc = ah__hook_doc(s, t);
    json_object_set_new(doc, "prompt",
                        json_pack("{s:s, s:O, s:o}", "messageId", t->message_id, "content", t->content,
                                  "text", prompt_text(t->content)));
    int rc = ah__turn_hooks(t, "prompt_submit", NULL, NULL, doc, prompt_hooked, NULL);
    if (rc < 0)
      ah__turn_end(t, "error", NULL, "the prompt_submit hooks could not run (out of memory)");
    if (rc != 0)
      return;
  }
  gather_tools(t);
}

static void gather_tools(turn *t) {
  session *s = t->s;
  t->tools_running++; /* the gathering: an end meanwhile waits for it */
  t->gathering = true;
  int rc = ah__tools_gather(t->m->host, s->id, str(s->row, "cwd"), t->cancel, tools_gathered, t);
  if (rc) {
    t->tools_running--;
    t->gathering = false;
    ah__turn_end(t, "error", NULL, ah_strerror(rc));
  }
}

/* After a step of the turn's start that an end waited for: false (and the end recorded) when it ended or
 * was cancelled meanwhile. */
static bool goes_on(turn *t) {
  if (t->end_pending)
    finish_pending_end(t);
  else if (t->cancelled)
    ah__turn_end(t, "cancelled", NULL, NULL);
  else
    return true;
  return false;
}

static void tools_gathered(const json_t *tools, const json_t *notices, void *arg) {
  turn *t = arg;
  t->tools_running--;
  t->gathering = false;
  t->tools = json_incref((json_t *)tools);
  if (!goes_on(t))
    return;
  session *s = t->s;
  size_t i;
  json_t *n;
  json_array_foreach(notices, i, n) {
    ah__write_event(s, "turn/notice", t->id, NULL, json_pack("{s:s, s:O}", "kind", "tools", "message", n));
  }
  /* The conversation so far (sink_history) is read from the store first, off the loop: a recent window of
   * the session's events, so a resumed session has its past and a long one does not make every turn
   * slower. The built-in echo asks for it only for a /history step. */
  if (ah__turn_provider(t->m, str(s->row, "provider"), NULL, NULL) == t->m->echo &&
      !ah__echo_uses_history(t->content)) {
    start_provider(t);
    return;
  }
  t->tools_running++; /* an end meanwhile waits for the read */
  t->gathering = true;
  int64_t after = s->seq > HISTORY_WINDOW ? s->seq - HISTORY_WINDOW : 0;
  ah_store_query q = {.kind = AH_STORE_Q_EVENTS, .id = s->id, .after = after, .limit = HISTORY_WINDOW};
  int rc = ah__store_read(ah__sm_store(t->m), &q, 1, history_read, t);
  if (rc) {
    t->tools_running--;
    t->gathering = false;
    ah__turn_end(t, "error", NULL, ah_strerror(rc));
  }
}

static void history_read(int status, const json_t *results, void *arg) {
  turn *t = arg;
  t->tools_running--;
  t->gathering = false;
  t->history_page = status == 0 ? json_incref(json_array_get(results, 0)) : NULL;
  if (!goes_on(t))
    return;
  if (status) {
    ah__turn_end(t, "error", NULL, "the conversation so far could not be read from the store");
    return;
  }
  start_provider(t);
}

static void start_provider(turn *t) {
  session *s = t->s;
  /* Looked up again: the provider's plugin may have gone, or the configuration changed, meanwhile. */
  const char *prov_name = str(s->row, "provider");
  const json_t *prov_config = NULL;
  t->prov = ah__turn_provider(t->m, prov_name, &t->prov_mount, &prov_config);
  if (!t->prov) {
    ah__turn_end(t, "error", NULL, "the session's provider is not available");
    return;
  }
  static const ah_turn_sink sink = {
      .struct_size = sizeof(ah_turn_sink),
      .delta = sink_delta,
      .commit = sink_commit,
      .tool_call = sink_tool_call,
      .ask = sink_ask,
      .subagent = sink_subagent,
      .end = sink_end,
      .history = sink_history,
      .commit_json = sink_commit_json,
      .reasoning = sink_reasoning,
      .notice = sink_notice,
      .usage = sink_usage,
  };
  /* The provider's section as configured, with the session's reasoning effort in place of the
   * configured one (docs/sessions.md "Options"). */
  json_t *turn_config = prov_config ? json_copy((json_t *)prov_config) : json_object();
  const char *requested = str(s->row, "model") ? str(s->row, "model") : str(prov_config, "model");
  snprintf(t->requested_model, sizeof t->requested_model, "%s", requested ? requested : "");
  const char *effort = ah__session_effort_of(t->m, s->row);
  if (effort && turn_config)
    json_object_set_new(turn_config, "reasoning_effort", json_string(effort));
  ah_turn_input in = {
      .struct_size = sizeof in,
      .session_id = s->id,
      .cwd = str(s->row, "cwd"),
      .model = str(s->row, "model"),
      .content = t->content,
      .tools = t->tools,
      .max_tokens = 0,
      .depth = (int)json_integer_value(json_object_get(s->row, "depth")),
      .provider_name = prov_name ? prov_name : "echo",
      .provider_config = turn_config,
  };
  int rc = turn_config ? t->prov->turn_start(t->prov, &in, &sink, t, &t->pt) : AH_ENOMEM;
  json_decref(turn_config);
  /* The content was borrowed for the call: a provider that needs it later took its own reference, and a
   * large prompt goes as soon as nothing uses it any more, not at the end of the turn. */
  json_decref(t->content);
  t->content = NULL;
  if (rc) {
    t->pt = NULL;
    ah__turn_end(t, "error", NULL, ah_strerror(rc));
  }
}

static void on_turn_token(ah_cancel *token, void *arg) {
  (void)token;
  turn *t = arg;
  if (t->ended || t->cancelled)
    return;
  t->cancelled = true;
  if (t->pending)
    ah__request_resolve(t->pending, "cancelled", NULL, NULL, NULL);
  if (t->pt)
    t->prov->turn_cancel(t->pt);
  else if (!t->gathering) /* else the sources' answers end it: their calls were cancelled with the token */
    ah__turn_end(t, "cancelled", NULL, NULL);
}
