/* Server requests: the approvals and questions a turn waits on (request.pending / request.resolved), their
 * stored rows, and the recent resolutions kept for late answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

json_t *ah__request_json(const request *r) {
  return json_pack("{s:s, s:s, s:s?, s:s, s:O, s:O, s:s}", "id", r->id, "sessionId", r->session_id, "turnId",
                   r->turn_id, "kind", r->kind, "params", r->params, "options", r->options, "state",
                   "pending");
}

/* With a shared store, the other hosts learn of a request's changes from the store ("request:SESSION"). */
static void signal_request(ah_sessions *m, json_t *ops, const char *sid) {
  if (!ah__hosts_active(m))
    return;
  char payload[96];
  snprintf(payload, sizeof payload, "request:%s", sid);
  json_array_append_new(ops, json_pack("{s:s, s:s}", "op", "notify", "payload", payload));
}

json_t *ah__request_state_ops(ah_sessions *m, const char *id, const char *sid, const char *state,
                              const json_t *answer) {
  char now[32];
  ah__time_rfc3339(now);
  json_t *op =
      json_pack("{s:s, s:s, s:s, s:s}", "op", "request.state", "id", id, "state", state, "resolved", now);
  if (answer)
    json_object_set(op, "answer", (json_t *)answer);
  json_t *ops = json_pack("[o]", op);
  signal_request(m, ops, sid);
  return ops;
}

request *ah__request_new(turn *t, const char *kind, json_t *params, json_t *options) {
  ah_sessions *m = t->s->m;
  request *r = calloc(1, sizeof *r);
  if (!r) {
    json_decref(params);
    json_decref(options);
    return NULL;
  }
  r->m = m;
  ah__uuid7(r->id);
  r->session_id = strdup(t->s->id);
  r->turn_id = strdup(t->id);
  r->kind = strdup(kind);
  r->params = params;
  r->options = options;
  r->t = t;
  t->pending = r;
  ah__list_push(&m->requests, &r->link);
  HASH_ADD_STR(m->requests_by_id, id, r);
  char now[32];
  ah__time_rfc3339(now);
  json_t *row = ah__request_json(r);
  json_object_set_new(row, "created", json_string(now));
  json_t *ops = json_pack("[{s:s, s:o}]", "op", "request.put", "request", row);
  signal_request(m, ops, r->session_id);
  ah__write_ops(t->s, ops, NULL, NULL, NULL, NULL, NULL, NULL);
  ah__sm_emit(m, "request.pending", json_pack("{s:o}", "request", ah__request_json(r)));
  return r;
}

void ah__request_free(request *r) {
  ah__list_remove(&r->link);
  HASH_DEL(r->m->requests_by_id, r);
  free(r->session_id);
  free(r->turn_id);
  free(r->kind);
  json_decref(r->params);
  json_decref(r->options);
  free(r->call_id);
  free(r->tool);
  json_decref(r->args);
  free(r);
}

request *ah__request_find(ah_sessions *m, const char *id) {
  request *r = NULL;
  if (id)
    HASH_FIND_STR(m->requests_by_id, id, r);
  return r;
}

static void remember_resolution(ah_sessions *m, const char *id, const char *state, const ah_caller *by) {
  char who[96] = "";
  if (by)
    snprintf(who, sizeof who, "%s:%llu", by->surface ? by->surface : "",
             (unsigned long long)by->connection_id);
  json_object_set_new(m->resolved, id, json_pack("{s:s, s:s}", "state", state, "by", who));
  json_array_append_new(m->resolved_order, json_string(id));
  if (json_array_size(m->resolved_order) > 4096) {
    json_object_del(m->resolved, json_string_value(json_array_get(m->resolved_order, 0)));
    json_array_remove(m->resolved_order, 0);
  }
}

/* ---- requests: answers
 * ------------------------------------------------------------------------------------- */

static void resolve(request *r, const char *state, const json_t *answer, const char *option_id,
                    const ah_caller *by, bool stored);

void ah__request_resolve(request *r, const char *state, const json_t *answer, const char *option_id,
                         const ah_caller *by) {
  resolve(r, state, answer, option_id, by, false);
}

typedef struct adopt_ctx {
  ah_sessions *m;
  char id[40];
} adopt_ctx;

static void adopt_read(int status, const json_t *results, void *arg) {
  adopt_ctx *c = arg;
  request *r = ah__request_find(c->m, c->id); /* it may have been resolved here meanwhile */
  const json_t *row = status == 0 ? json_array_get(results, 0) : NULL;
  const char *state = str(row, "state");
  if (r && !r->answering && state && strcmp(state, "pending") != 0) {
    const json_t *answer = json_object_get(row, "answer");
    const char *opt = json_is_object(answer) ? str(answer, "optionId") : NULL;
    AH_LOG_I(LOG, "request %s was answered on another host (%s)", r->id, state);
    resolve(r, state, json_is_object(answer) ? answer : NULL, opt, NULL, true);
  }
  free(c);
}

/* Another host may have answered it: its row is read, and a resolution there is acted on here. */
void ah__request_adopt(request *r) {
  if (r->answering)
    return; /* an answer given here is being stored: its callback reads the outcome */
  adopt_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->m = r->m;
  snprintf(c->id, sizeof c->id, "%s", r->id);
  ah_store_query q = {.kind = AH_STORE_Q_REQUEST, .id = c->id};
  if (ah__store_read(ah__sm_store(r->m), &q, 1, adopt_read, c) != 0)
    free(c);
}

/* `stored`: the row holds the resolution already (another host wrote it). */
static void resolve(request *r, const char *state, const json_t *answer, const char *option_id,
                    const ah_caller *by, bool stored) {
  ah_sessions *m = r->m;
  turn *t = r->t;
  if (t && t->pending == r)
    t->pending = NULL;
  remember_resolution(m, r->id, state, by);
  if (t && !stored)
    ah__write_ops(t->s, ah__request_state_ops(m, r->id, r->session_id, state, answer), NULL, NULL, NULL, NULL,
                  NULL, NULL);
  json_t *ev = json_pack("{s:s, s:s, s:s}", "id", r->id, "sessionId", r->session_id, "state", state);
  if (answer)
    json_object_set(ev, "answer", (json_t *)answer);
  ah__sm_emit(m, "request.resolved", ev);
  if (t && strcmp(r->kind, "approval") == 0) {
    const char *outcome = strcmp(state, "granted") == 0  ? "granted"
                          : strcmp(state, "denied") == 0 ? "denied"
                                                         : "cancelled";
    json_t *data = json_pack("{s:s, s:s, s:s, s:s}", "callId", r->call_id, "name", r->tool, "requestId",
                             r->id, "outcome", outcome);
    if (option_id)
      json_object_set_new(data, "optionId", json_string(option_id));
    ah__write_event(t->s, "tool/approval", t->id, NULL, data);
    /* allow_always / reject_always set the session's policy for that tool, stored with the session. */
    if (option_id && (strcmp(option_id, "allow_always") == 0 || strcmp(option_id, "reject_always") == 0)) {
      json_t *policy = json_deep_copy(json_object_get(t->s->row, "policy"));
      if (!json_is_object(policy)) {
        json_decref(policy);
        policy = json_object();
      }
      json_object_set_new(policy, r->tool, json_string(option_id[0] == 'a' ? "allow" : "deny"));
      ah__write_fields(t->s, json_pack("{s:o}", "policy", policy));
    }
    if (strcmp(outcome, "granted") == 0 && !t->ended && !t->cancelled)
      ah__turn_run_tool(t, r->call_id, r->tool, r->args);
    else
      ah__turn_tool_refused(t, r->call_id, r->tool,
                            strcmp(outcome, "denied") == 0 ? "denied by the user" : "cancelled");
  } else if (t) {
    json_t *data = json_pack("{s:s, s:s}", "requestId", r->id, "outcome", state);
    if (answer)
      json_object_set(data, "answer", json_object_get(answer, "answer"));
    ah__write_event(t->s, "question/answered", t->id, NULL, data);
    if (!t->ended && t->pt && !t->cancelled)
      t->prov->turn_answer(t->pt, answer ? json_object_get(answer, "answer") : NULL,
                           strcmp(state, "answered") != 0);
  }
  ah__request_free(r);
}

bool ah__request_is_option(const json_t *options, const char *id) {
  size_t i = 0;
  json_t *o = NULL;
  json_array_foreach(options, i, o) {
    if (json_is_string(o) && strcmp(json_string_value(o), id) == 0)
      return true;
  }
  return false;
}

/* ---- an answer given here, with a shared store -------------------------------------------------------- */

typedef struct answer_ctx {
  ah_sessions *m;
  ah_call *call;
  char id[37];
  char *state;
  json_t *answer;
  char *option_id;
} answer_ctx;

static void answer_written(session *s, int status, const json_t *event, void *arg) {
  (void)s;
  (void)event;
  answer_ctx *a = arg;
  request *r = ah__request_find(a->m, a->id);
  if (r)
    r->answering = false;
  if (status == 0 && r) {
    resolve(r, a->state, a->answer, a->option_id, ah__call_caller(a->call), true);
    ah__call_reply(a->call, json_pack("{s:b}", "accepted", 1));
  } else if (status == 0 || status == AH_ESTATE) {
    /* Another host's answer (or this host's cancellation) came first: the stored one is acted on. */
    if (r)
      ah__request_adopt(r);
    ah__call_reply(a->call, json_pack("{s:b, s:s}", "accepted", 0, "reason", "resolved"));
  } else {
    ah__call_error(a->call, status, "the answer could not be stored", NULL);
  }
  free(a->state);
  json_decref(a->answer);
  free(a->option_id);
  free(a);
}

void ah__request_answer(request *r, const char *state, const json_t *answer, const char *option_id,
                        ah_call *call) {
  ah_sessions *m = r->m;
  if (!ah__hosts_active(m) || !r->t) {
    ah__request_resolve(r, state, answer, option_id, ah__call_caller(call));
    ah__call_reply(call, json_pack("{s:b}", "accepted", 1));
    return;
  }
  /* Several hosts may answer: the store decides which answer is the first (the row's pending state), and
   * only that one is acted on, here as on the other hosts. */
  if (r->answering) {
    ah__call_reply(call, json_pack("{s:b, s:s}", "accepted", 0, "reason", "resolved"));
    return;
  }
  answer_ctx *a = calloc(1, sizeof *a);
  if (!a) {
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  a->m = m;
  a->call = call;
  memcpy(a->id, r->id, sizeof a->id);
  a->state = strdup(state);
  a->answer = answer ? json_deep_copy(answer) : NULL;
  a->option_id = option_id ? strdup(option_id) : NULL;
  r->answering = true;
  ah__write_ops(r->t->s, ah__request_state_ops(m, r->id, r->session_id, state, answer), NULL, NULL, NULL,
                NULL, answer_written, a);
}
