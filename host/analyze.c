/* agenthost — offline analysis of recordings and exports (analyze.h). */
#include "analyze.h"

#include "jsonscan.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- small pieces ---------------------------------------------------------------------------------------
 */

static const char *sget(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

/* Ranges of whole numbers seen (sorted, disjoint, not adjacent): seqs of a session or of a connection. */
typedef struct ranges {
  int64_t (*r)[2];
  size_t n, cap;
} ranges;

/* Add v; false when it was already there (a duplicate). */
static bool ranges_add(ranges *s, int64_t v) {
  /* the common case: the next one after the last range */
  if (s->n && s->r[s->n - 1][1] + 1 == v) {
    s->r[s->n - 1][1] = v;
    return true;
  }
  size_t lo = 0, hi = s->n;
  while (lo < hi) { /* first range with r[1] >= v */
    size_t mid = (lo + hi) / 2;
    if (s->r[mid][1] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < s->n && s->r[lo][0] <= v)
    return false;
  bool join_prev = lo > 0 && s->r[lo - 1][1] + 1 == v;
  bool join_next = lo < s->n && s->r[lo][0] - 1 == v;
  if (join_prev && join_next) {
    s->r[lo - 1][1] = s->r[lo][1];
    memmove(&s->r[lo], &s->r[lo + 1], (s->n - lo - 1) * sizeof s->r[0]);
    s->n--;
  } else if (join_prev) {
    s->r[lo - 1][1] = v;
  } else if (join_next) {
    s->r[lo][0] = v;
  } else {
    if (s->n == s->cap) {
      size_t cap = s->cap ? s->cap * 2 : 4;
      void *nr = realloc(s->r, cap * sizeof s->r[0]);
      if (!nr)
        return true;
      s->r = nr;
      s->cap = cap;
    }
    memmove(&s->r[lo + 1], &s->r[lo], (s->n - lo) * sizeof s->r[0]);
    s->r[lo][0] = s->r[lo][1] = v;
    s->n++;
  }
  return true;
}

/* The holes between the ranges: [[from, to], …]. */
static json_t *ranges_gaps(const ranges *s) {
  json_t *g = json_array();
  for (size_t i = 1; i < s->n; i++)
    json_array_append_new(
        g, json_pack("[I, I]", (json_int_t)(s->r[i - 1][1] + 1), (json_int_t)(s->r[i][0] - 1)));
  return g;
}

static uint64_t fnv(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ULL;
  }
  return h;
}

/* ---- state ----------------------------------------------------------------------------------------------
 */

typedef struct round_use {
  char *model;
  char time[32];
  ah_tokens t;
} round_use;

typedef struct turn_a {
  char *id;
  char *provider;
  char *requested;
  char *model; /* reported at the end (NULL: none or several) */
  bool mixed;
  char started[32], ended[32];
  char *reason;
  char *error;
  ah_tokens end_usage;
  bool has_end;
  bool end_usage_ok;
  round_use *rounds;
  size_t nrounds;
} turn_a;

typedef struct request_a {
  char *id;
  char *session;
  char *turn;
  char *kind; /* approval | question */
  char *tool;
  char asked[32];
  char *state; /* pending | granted | denied | answered | cancelled */
  char resolved[32];
  char *by_source, *by_conn; /* the connection whose answer was accepted, when observed */
  bool seen_asked;
} request_a;

typedef struct session_a {
  char *id;
  char *parent;
  json_t *children; /* [id] */
  ranges seqs;
  json_t *unknown_kinds; /* kind → count */
  turn_a *turns;
  size_t nturns, cap;
  json_t *turn_index; /* turnId → index */
  json_t *calls;      /* name#hash → {name, count, firstSeq} */
  json_t *failures;   /* [{turnId, callId, name, error}] */
  json_t *hooks;      /* [{seq, turnId?, hook, event, source, plugin?, outcome, durationMs, …}] */
  json_t *call_names; /* callId → name */
  int64_t events;
} session_a;

typedef struct conn_a {
  char *source, *conn;
  ranges seqs;
  int64_t records;
  char first[32], last[32];
  int64_t losses;
  bool opened, closed;
  json_t *outstanding;     /* key → {method, id, sentAt} */
  json_t *unknown_methods; /* method → count */
  json_t *answers;         /* corr → request id: a client-response waiting for its receipt */
} conn_a;

typedef struct input_a {
  char *name;
  json_t *meta;
  int64_t lines, records, events, duplicates, malformed, skipped_after;
} input_a;

struct ah_analysis {
  ah_analysis_opts o;
  char as_of[32];
  session_a *sessions;
  size_t nsessions, scap;
  json_t *session_index;
  request_a *requests;
  size_t nrequests, rcap;
  json_t *request_index;
  conn_a *conns;
  size_t nconns, ccap;
  size_t last_conn; /* the connection of the last record (most follow it) */
  json_t *conn_index;
  input_a *inputs;
  size_t ninputs;
};

/* The element of `key` in an array of `size`-byte elements that `index` maps (key → position); when absent,
 * a new zeroed one at the end (*created). SLOT keeps the array's type. */
static void *slot(json_t *index, const char *key, void **arr, size_t *n, size_t *cap, size_t size,
                  bool *created) {
  json_t *ix = json_object_get(index, key);
  *created = !ix;
  if (ix)
    return (char *)*arr + (size_t)json_integer_value(ix) * size;
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    void *np = realloc(*arr, nc * size);
    if (!np)
      abort();
    *arr = np;
    *cap = nc;
  }
  void *e = (char *)*arr + *n * size;
  memset(e, 0, size);
  json_object_set_new(index, key, json_integer((json_int_t)*n));
  (*n)++;
  return e;
}

#define SLOT(index, key, arr, n, cap, created)                                    \
  __extension__({                                                                 \
    void *p_ = (arr);                                                             \
    void *e_ = slot((index), (key), &p_, &(n), &(cap), sizeof *(arr), (created)); \
    (arr) = p_;                                                                   \
    (__typeof__(arr))e_;                                                          \
  })

static char *dup_or_null(const char *s) {
  return s ? strdup(s) : NULL;
}

static void set_str(char **slot, const char *v) {
  if (!v)
    return;
  free(*slot);
  *slot = strdup(v);
}

static void copy_time(char dst[32], const char *t) {
  snprintf(dst, 32, "%s", t ? t : "");
}

ah_analysis *ah__analysis_new(const ah_analysis_opts *opts) {
  ah_analysis *a = calloc(1, sizeof *a);
  if (!a)
    return NULL;
  if (opts)
    a->o = *opts;
  if (a->o.repeat_threshold <= 0)
    a->o.repeat_threshold = 3;
  if (a->o.as_of) {
    if (strlen(a->o.as_of) == 10)
      snprintf(a->as_of, sizeof a->as_of, "%sT23:59:59.999Z", a->o.as_of);
    else
      snprintf(a->as_of, sizeof a->as_of, "%s", a->o.as_of);
  }
  a->session_index = json_object();
  a->request_index = json_object();
  a->conn_index = json_object();
  return a;
}

void ah__analysis_free(ah_analysis *a) {
  if (!a)
    return;
  for (size_t i = 0; i < a->nsessions; i++) {
    session_a *s = &a->sessions[i];
    free(s->id);
    free(s->parent);
    json_decref(s->children);
    free(s->seqs.r);
    json_decref(s->unknown_kinds);
    for (size_t k = 0; k < s->nturns; k++) {
      turn_a *t = &s->turns[k];
      free(t->id);
      free(t->provider);
      free(t->requested);
      free(t->model);
      free(t->reason);
      free(t->error);
      for (size_t r = 0; r < t->nrounds; r++)
        free(t->rounds[r].model);
      free(t->rounds);
    }
    free(s->turns);
    json_decref(s->turn_index);
    json_decref(s->calls);
    json_decref(s->failures);
    json_decref(s->hooks);
    json_decref(s->call_names);
  }
  free(a->sessions);
  for (size_t i = 0; i < a->nrequests; i++) {
    request_a *r = &a->requests[i];
    free(r->id);
    free(r->session);
    free(r->turn);
    free(r->kind);
    free(r->tool);
    free(r->state);
    free(r->by_source);
    free(r->by_conn);
  }
  free(a->requests);
  for (size_t i = 0; i < a->nconns; i++) {
    conn_a *c = &a->conns[i];
    free(c->source);
    free(c->conn);
    free(c->seqs.r);
    json_decref(c->outstanding);
    json_decref(c->unknown_methods);
    json_decref(c->answers);
  }
  free(a->conns);
  for (size_t i = 0; i < a->ninputs; i++) {
    free(a->inputs[i].name);
    json_decref(a->inputs[i].meta);
  }
  free(a->inputs);
  json_decref(a->session_index);
  json_decref(a->request_index);
  json_decref(a->conn_index);
  free(a);
}

void ah__analysis_input(ah_analysis *a, const char *name, const json_t *meta) {
  input_a *ni = realloc(a->inputs, (a->ninputs + 1) * sizeof *ni);
  if (!ni)
    abort();
  a->inputs = ni;
  input_a *in = &a->inputs[a->ninputs++];
  memset(in, 0, sizeof *in);
  in->name = strdup(name ? name : "-");
  in->meta = meta ? json_deep_copy(meta) : NULL;
}

static input_a *cur_input(ah_analysis *a) {
  if (!a->ninputs)
    ah__analysis_input(a, "-", NULL);
  return &a->inputs[a->ninputs - 1];
}

static session_a *session_get(ah_analysis *a, const char *id) {
  bool created;
  session_a *s = SLOT(a->session_index, id, a->sessions, a->nsessions, a->scap, &created);
  if (created) {
    s->id = strdup(id);
    s->children = json_array();
    s->unknown_kinds = json_object();
    s->turn_index = json_object();
    s->calls = json_object();
    s->failures = json_array();
    s->hooks = json_array();
    s->call_names = json_object();
  }
  return s;
}

static turn_a *turn_get(session_a *s, const char *id) {
  bool created;
  turn_a *t = SLOT(s->turn_index, id, s->turns, s->nturns, s->cap, &created);
  if (created)
    t->id = strdup(id);
  return t;
}

static request_a *request_get(ah_analysis *a, const char *id) {
  bool created;
  request_a *r = SLOT(a->request_index, id, a->requests, a->nrequests, a->rcap, &created);
  if (created) {
    r->id = strdup(id);
    r->state = strdup("pending");
  }
  return r;
}

static conn_a *conn_find(ah_analysis *a, const char *source, const char *conn);

static conn_a *conn_get(ah_analysis *a, const char *source, const char *conn) {
  if (a->last_conn < a->nconns && strcmp(a->conns[a->last_conn].conn, conn) == 0 &&
      strcmp(a->conns[a->last_conn].source, source) == 0)
    return &a->conns[a->last_conn];
  conn_a *found = conn_find(a, source, conn);
  a->last_conn = (size_t)(found - a->conns);
  return found;
}

static conn_a *conn_find(ah_analysis *a, const char *source, const char *conn) {
  char key[600];
  snprintf(key, sizeof key, "%.290s\x1f%.290s", source, conn);
  bool created;
  conn_a *c = SLOT(a->conn_index, key, a->conns, a->nconns, a->ccap, &created);
  if (created) {
    c->source = strdup(source);
    c->conn = strdup(conn);
    c->outstanding = json_object();
    c->unknown_methods = json_object();
    c->answers = json_object();
  }
  return c;
}

static void count(json_t *map, const char *key) {
  json_object_set_new(map, key, json_integer(json_integer_value(json_object_get(map, key)) + 1));
}

static bool after_as_of(const ah_analysis *a, const char *time) {
  return a->as_of[0] && time && strcmp(time, a->as_of) > 0;
}

/* ---- stored events --------------------------------------------------------------------------------------
 */

static const char *const known_kinds[] = {
    "inbox/received",    "inbox/claimed", "turn/started",    "message/committed", "tool/call",
    "tool/approval",     "tool/result",   "question/asked",  "question/answered", "subagent/started",
    "subagent/finished", "turn/ended",    "agent/error",     "turn/notice",       "model/usage",
    "hook/ran",          "plan/updated",  "inbox/cancelled",
};

static void resolve(request_a *r, const char *state, const char *time) {
  if (strcmp(r->state, "pending") != 0 && strcmp(state, "cancelled") == 0)
    return; /* an answer already known is not undone by a later cancellation report */
  set_str(&r->state, state);
  if (time && !r->resolved[0])
    copy_time(r->resolved, time);
}

static void on_event(ah_analysis *a, const json_t *ev) {
  const char *sid = sget(ev, "sessionId"), *kind = sget(ev, "kind"), *time = sget(ev, "time");
  const json_t *seqv = json_object_get(ev, "seq");
  input_a *in = cur_input(a);
  const json_t *dv = json_object_get(ev, "data");
  if (!sid || !kind || !json_is_integer(seqv) || (dv && !json_is_object(dv))) {
    in->malformed++;
    return;
  }
  if (after_as_of(a, time)) {
    in->skipped_after++;
    return;
  }
  session_a *s = session_get(a, sid);
  if (!ranges_add(&s->seqs, json_integer_value(seqv))) {
    in->duplicates++;
    return;
  }
  in->events++;
  s->events++;
  const json_t *d = json_object_get(ev, "data");
  const char *tid = sget(ev, "turnId");
  bool known = false;
  for (size_t i = 0; i < sizeof known_kinds / sizeof known_kinds[0] && !known; i++)
    known = strcmp(kind, known_kinds[i]) == 0;
  if (!known) {
    count(s->unknown_kinds, kind); /* kept as an opaque item */
    return;
  }
  turn_a *t = tid ? turn_get(s, tid) : NULL;
  if (strcmp(kind, "turn/started") == 0 && t) {
    copy_time(t->started, time);
    set_str(&t->provider, sget(d, "provider"));
    set_str(&t->requested, sget(d, "model"));
  } else if (strcmp(kind, "model/usage") == 0 && t) {
    round_use *nr = realloc(t->rounds, (t->nrounds + 1) * sizeof *nr);
    if (!nr)
      abort();
    t->rounds = nr;
    round_use *r = &t->rounds[t->nrounds];
    char err[120];
    if (ah__tokens_from_json(json_object_get(d, "usage"), &r->t, err, sizeof err) != 0)
      memset(&r->t, 0, sizeof r->t);
    if (!json_object_get(json_object_get(d, "usage"), "requests"))
      r->t.requests = 1; /* one report is one round trip */
    r->model = dup_or_null(sget(json_object_get(d, "usage"), "model"));
    copy_time(r->time, time);
    t->nrounds++;
    if (!t->requested)
      set_str(&t->requested, sget(d, "requestedModel"));
  } else if (strcmp(kind, "turn/ended") == 0 && t) {
    const json_t *u = json_object_get(d, "usage");
    char err[120];
    t->has_end = true;
    copy_time(t->ended, time);
    set_str(&t->reason, sget(d, "reason"));
    set_str(&t->error, sget(d, "error"));
    t->end_usage_ok = ah__tokens_from_json(u, &t->end_usage, err, sizeof err) == 0;
    t->mixed = json_array_size(json_object_get(u, "models")) > 1;
    set_str(&t->model, sget(u, "model"));
    if (sget(d, "requestedModel"))
      set_str(&t->requested, sget(d, "requestedModel"));
  } else if (strcmp(kind, "tool/call") == 0) {
    const char *name = sget(d, "name");
    if (!name)
      return;
    char *args = json_dumps(json_object_get(d, "args"), JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    char key[200];
    snprintf(key, sizeof key, "%.150s#%016llx", name,
             (unsigned long long)fnv(args ? args : "", args ? strlen(args) : 0));
    free(args);
    json_t *c = json_object_get(s->calls, key);
    if (!c) {
      c = json_pack("{s:s, s:i, s:I, s:s?}", "name", name, "count", 0, "firstSeq",
                    (json_int_t)json_integer_value(seqv), "turnId", tid);
      json_object_set_new(s->calls, key, c);
    }
    json_object_set_new(c, "count", json_integer(json_integer_value(json_object_get(c, "count")) + 1));
    if (sget(d, "callId"))
      json_object_set_new(s->call_names, sget(d, "callId"), json_string(name));
  } else if (strcmp(kind, "tool/result") == 0 && json_is_true(json_object_get(d, "isError"))) {
    const json_t *res = json_object_get(d, "result");
    const char *msg = json_is_string(res) ? json_string_value(res) : sget(res, "error");
    if (!msg)
      msg = sget(res, "message");
    json_array_append_new(s->failures, json_pack("{s:s?, s:s?, s:s?, s:s?, s:I}", "turnId", tid, "callId",
                                                 sget(d, "callId"), "name", sget(d, "name"), "error", msg,
                                                 "seq", (json_int_t)json_integer_value(seqv)));
  } else if (strcmp(kind, "hook/ran") == 0) {
    /* a hook's run as the host stored it; only what names and judges it is kept (never a document) */
    json_t *run = json_object();
    static const char *const keep[] = {"hook",   "event", "source",  "plugin", "outcome",
                                       "reason", "error", "onError", "tool",   "callId"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
      if (sget(d, keep[i]))
        json_object_set_new(run, keep[i], json_string(sget(d, keep[i])));
    if (!json_object_get(run, "hook") || !json_object_get(run, "outcome")) {
      json_decref(run);
      in->malformed++;
      return;
    }
    const json_t *ms = json_object_get(d, "durationMs");
    if (json_is_integer(ms) && json_integer_value(ms) >= 0)
      json_object_set_new(run, "durationMs", json_integer(json_integer_value(ms)));
    json_object_set_new(run, "seq", json_integer(json_integer_value(seqv)));
    if (tid)
      json_object_set_new(run, "turnId", json_string(tid));
    json_array_append_new(s->hooks, run);
  } else if (strcmp(kind, "tool/approval") == 0 || strcmp(kind, "question/answered") == 0) {
    const char *rid = sget(d, "requestId");
    if (!rid)
      return;
    request_a *r = request_get(a, rid);
    set_str(&r->session, sid);
    set_str(&r->turn, tid);
    if (!r->kind)
      r->kind = strdup(kind[0] == 't' ? "approval" : "question");
    if (kind[0] == 't')
      set_str(&r->tool, sget(d, "name"));
    const char *outcome = sget(d, "outcome");
    resolve(r, outcome ? outcome : "answered", time);
  } else if (strcmp(kind, "question/asked") == 0) {
    const char *rid = sget(d, "requestId");
    if (!rid)
      return;
    request_a *r = request_get(a, rid);
    set_str(&r->session, sid);
    set_str(&r->turn, tid);
    set_str(&r->kind, "question");
    if (!r->asked[0])
      copy_time(r->asked, time);
    r->seen_asked = true;
  } else if (strcmp(kind, "subagent/started") == 0) {
    const char *child = sget(d, "sessionId");
    if (!child)
      return;
    session_a *c = session_get(a, child);
    s = session_get(a, sid); /* the array may have moved */
    set_str(&c->parent, sid);
    bool listed = false;
    size_t i;
    json_t *e;
    json_array_foreach(s->children, i, e) listed = listed || strcmp(json_string_value(e), child) == 0;
    if (!listed)
      json_array_append_new(s->children, json_string(child));
  }
}

/* ---- observations ---------------------------------------------------------------------------------------
 */

static const char *const known_pushes[] = {
    "session.event",
    "session.delta",
    "session.reasoning",
    "session.progress",
    "session.status",
    "subagent.started",
    "subagent.finished",
    "request.approval",
    "request.question",
    "request.resolved",
    "request.pending",
    "plugin.mounted",
    "plugin.withdrawn",
    "session.created",
    "session.closed",
    "session.options",
    "session.updated",
    "host.config-changed",
    "tools.changed",
    "host/remote-event",
    "stream/error",
    "request/approval",
    "request/question",
    "session/update",
    "session/request_permission",
    "fs/read_text_file",
    "fs/write_text_file",
    "terminal/create",
    "terminal/output",
    "terminal/wait_for_exit",
    "terminal/release",
    "terminal/kill",
};

static bool known_push(const char *m) {
  for (size_t i = 0; i < sizeof known_pushes / sizeof known_pushes[0]; i++)
    if (strcmp(m, known_pushes[i]) == 0)
      return true;
  return false;
}

static void request_asked(ah_analysis *a, const json_t *req, const char *time) {
  const char *id = sget(req, "id");
  if (!id)
    return;
  request_a *r = request_get(a, id);
  set_str(&r->session, sget(req, "sessionId"));
  if (r->session)
    session_get(a, r->session); /* listed even when none of its events was observed */
  set_str(&r->turn, sget(req, "turnId"));
  set_str(&r->kind, sget(req, "kind"));
  set_str(&r->tool, sget(json_object_get(req, "params"), "tool"));
  if (!r->asked[0])
    copy_time(r->asked, time);
  r->seen_asked = true;
}

/* What the host said to a client (a browser frame, a JSON-RPC message). */
static void on_incoming(ah_analysis *a, conn_a *c, const json_t *p, const char *corr, const char *time) {
  const char *method = sget(p, "method");
  const json_t *body = json_object_get(p, sget(p, "kind") ? "payload" : "params");
  /* a reply: the request it answers is no longer outstanding */
  if (!method) {
    char key[300] = "";
    const json_t *id = json_object_get(p, "id");
    if (corr)
      snprintf(key, sizeof key, "h:%.280s", corr);
    else if (json_is_string(id))
      snprintf(key, sizeof key, "s:%.280s", json_string_value(id));
    else if (json_is_integer(id))
      snprintf(key, sizeof key, "i:%lld", (long long)json_integer_value(id));
    if (key[0])
      json_object_del(c->outstanding, key);
    /* the receipt of a browser answer: accepted means this connection's answer won */
    const char *rid = corr ? sget(c->answers, corr) : NULL;
    if (rid && json_is_true(json_object_get(p, "accepted"))) {
      request_a *r = request_get(a, rid);
      set_str(&r->by_source, c->source);
      set_str(&r->by_conn, c->conn);
      if (strcmp(r->state, "pending") == 0)
        resolve(r, "answered", time);
    }
    if (corr)
      json_object_del(c->answers, corr);
    return;
  }
  if (!known_push(method)) {
    count(c->unknown_methods, method);
    return;
  }
  if (strcmp(method, "session.event") == 0) {
    const json_t *ev = json_object_get(body, "event");
    if (ev)
      on_event(a, ev);
  } else if (strcmp(method, "request.approval") == 0 || strcmp(method, "request.question") == 0 ||
             strcmp(method, "request.pending") == 0) {
    const json_t *req = json_object_get(body, "request") ? json_object_get(body, "request") : body;
    request_asked(a, req, time);
  } else if (strcmp(method, "request.resolved") == 0) {
    const char *id = sget(body, "id");
    if (id) {
      request_a *r = request_get(a, id);
      set_str(&r->session, sget(body, "sessionId"));
      const char *state = sget(body, "state");
      resolve(r, state ? state : "answered", time);
    }
  }
}

/* What a client said to the host: a call is outstanding until its reply is observed; a browser answer waits
 * for its receipt. */
static void on_outgoing(conn_a *c, const json_t *p, const char *corr, const char *time) {
  const char *method = sget(p, "method");
  const json_t *id = json_object_get(p, "id");
  char key[300] = "";
  if (corr)
    snprintf(key, sizeof key, "h:%.280s", corr);
  else if (method && json_is_string(id))
    snprintf(key, sizeof key, "s:%.280s", json_string_value(id));
  else if (method && json_is_integer(id))
    snprintf(key, sizeof key, "i:%lld", (long long)json_integer_value(id));
  if (key[0]) {
    const char *kind = sget(p, "kind");
    const char *what = method ? method : kind && strcmp(kind, "client-response") == 0 ? "respond" : "request";
    json_object_set_new(c->outstanding, key,
                        json_pack("{s:s, s:s, s:s?}", "method", what, "sentAt", time ? time : "", "id",
                                  corr ? corr : (json_is_string(id) ? json_string_value(id) : NULL)));
    if (json_is_integer(id))
      json_object_set_new(json_object_get(c->outstanding, key), "id", json_incref((json_t *)id));
  }
  if (corr && sget(p, "kind") && strcmp(sget(p, "kind"), "client-response") == 0 && sget(p, "rpcId"))
    json_object_set_new(c->answers, corr, json_string(sget(p, "rpcId")));
}

static void on_observation(ah_analysis *a, const json_t *rec) {
  input_a *in = cur_input(a);
  const char *source = sget(rec, "source"), *conn = sget(rec, "conn"), *wall = sget(rec, "wall");
  const json_t *seq = json_object_get(rec, "seq");
  if (!source || !conn || !json_is_integer(seq)) {
    in->malformed++;
    return;
  }
  if (after_as_of(a, wall)) {
    in->skipped_after++;
    return;
  }
  conn_a *c = conn_get(a, source, conn);
  if (!ranges_add(&c->seqs, json_integer_value(seq))) {
    in->duplicates++;
    return;
  }
  in->records++;
  c->records++;
  if (wall && (!c->first[0] || strcmp(wall, c->first) < 0))
    copy_time(c->first, wall);
  if (wall && strcmp(wall, c->last) > 0)
    copy_time(c->last, wall);
  const char *event = sget(rec, "event");
  if (event) {
    if (strcmp(event, "open") == 0)
      c->opened = true;
    else if (strcmp(event, "close") == 0 || strcmp(event, "end") == 0) /* end: the recording stops here */
      c->closed = true;
    else if (strcmp(event, "loss") == 0)
      c->losses++;
    return;
  }
  const char *dir = sget(rec, "dir");
  const json_t *p = json_object_get(rec, "payload");
  const char *corr = sget(rec, "corr");
  if (!dir || !p) {
    in->malformed++;
    return;
  }
  if (!json_is_object(p))
    return; /* a payload that was not JSON is kept as text: nothing to read in it */
  /* what the host said (to a client), whichever side recorded it */
  const char *side = sget(rec, "side");
  bool host_side = side ? strcmp(side, "host") == 0 : strncmp(source, "host:", 5) == 0;
  bool sent = strcmp(dir, "sent") == 0;
  if (sent == host_side)
    on_incoming(a, c, p, corr, wall);
  else
    on_outgoing(c, p, corr, wall);
}

/* ---- the fast path: a shallow scanner --------------------------------------------------------------------
 *
 * Most bytes of a recording are transient text (session.delta pushes, committed messages, prompts) that the
 * analysis never reads. Parsing them into jansson values cost ~3/4 of the time, so a line is first scanned
 * without building anything: the keys wanted at each level are located (their values' spans), everything
 * else is skipped by its framing (strings, escapes, brackets). Only the values the analysis reads are parsed.
 * A line the scanner cannot read plainly (a wanted string with an escape, an unexpected shape) goes through
 * the full parser instead, so the result never depends on the path. */

/* Kinds whose data the analysis reads. */
static bool data_wanted(ah_span kind) {
  static const char *const wanted[] = {
      "turn/started",  "model/usage",    "turn/ended",        "tool/call",        "tool/result",
      "tool/approval", "question/asked", "question/answered", "subagent/started", "hook/ran"};
  for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
    if (ah__span_is(kind, wanted[i]))
      return true;
  return false;
}

/* A stored event, scanned: only its head and, when read, its data are parsed. NULL: use the full parser. */
static json_t *event_of(ah_span sp) {
  static const char *const keys[] = {"sessionId", "seq", "kind", "time", "turnId", "data"};
  ah_span v[6];
  if (ah__json_scan(sp.p, sp.p + sp.n, keys, 6, v) != 0 || (v[5].p && v[5].p[0] != '{'))
    return NULL;
  json_t *sid = ah__span_str(v[0]), *seq = ah__span_int(v[1]), *kind = ah__span_str(v[2]);
  json_t *time = v[3].p ? ah__span_str(v[3]) : json_null();
  json_t *turn = v[4].p ? ah__span_str(v[4]) : json_null();
  json_t *data = data_wanted(v[2]) ? ah__span_json(v[5]) : json_object();
  if (!sid || !seq || !kind || !time || !turn || !data ||
      (v[5].p && data_wanted(v[2]) && !json_is_object(data))) {
    json_decref(sid), json_decref(seq), json_decref(kind), json_decref(time), json_decref(turn),
        json_decref(data);
    return NULL;
  }
  json_t *ev = json_pack("{s:o, s:o, s:o, s:o, s:o}", "sessionId", sid, "seq", seq, "kind", kind, "time",
                         time, "data", data);
  if (!json_is_null(turn))
    json_object_set_new(ev, "turnId", turn);
  else
    json_decref(turn);
  if (json_is_null(time))
    json_object_del(ev, "time");
  return ev;
}

/* Pushes whose bodies the analysis does not read. */
static bool body_unread(ah_span method) {
  static const char *const unread[] = {"session.delta",  "session.reasoning", "session.progress",
                                       "session.status", "session.options",   "session.updated",
                                       "tools.changed",  "plugin.mounted",    "plugin.withdrawn"};
  for (size_t i = 0; i < sizeof unread / sizeof unread[0]; i++)
    if (ah__span_is(method, unread[i]))
      return true;
  return false;
}

/* The payload as the analysis needs it: parsed whole, or reduced (a session.event to its event's head, an
 * unread push to its method). NULL: use the full parser. */
static json_t *payload_of(ah_span sp) {
  static const char *const keys[] = {"method", "kind", "payload", "params"};
  ah_span v[4];
  if (ah__json_scan(sp.p, sp.p + sp.n, keys, 4, v) != 0)
    return NULL;
  if (ah__span_is(v[0], "session.event")) {
    ah_span body = v[2].p ? v[2] : v[3];
    static const char *const bk[] = {"event"};
    ah_span e;
    if (!body.p || ah__json_scan(body.p, body.p + body.n, bk, 1, &e) != 0 || !e.p)
      return NULL;
    json_t *ev = event_of(e);
    if (!ev)
      return NULL;
    json_t *k = v[1].p ? ah__span_str(v[1]) : NULL;
    json_t *p =
        json_pack("{s:s, s:{s:o}}", "method", "session.event", v[2].p ? "payload" : "params", "event", ev);
    if (k)
      json_object_set_new(p, "kind", k);
    return p;
  }
  if (body_unread(v[0])) {
    json_t *m = ah__span_str(v[0]);
    return m ? json_pack("{s:o}", "method", m) : NULL;
  }
  return ah__span_json(sp);
}

/* Scan a line; 0 when it was handled, -1 when the full parser must read it. */
static int fast_line(ah_analysis *a, const char *line, size_t len) {
  static const char *const keys[] = {"source", "conn",  "seq",     "dir",       "side", "corr",
                                     "wall",   "event", "payload", "sessionId", "kind"};
  ah_span v[11];
  if (ah__json_scan(line, line + len, keys, 11, v) != 0)
    return -1;
  if (!v[0].p || !v[1].p) {
    if (!v[9].p || !v[10].p)
      return -1;
    json_t *ev = event_of((ah_span){line, len});
    if (!ev)
      return -1;
    on_event(a, ev);
    json_decref(ev);
    return 0;
  }
  json_t *rec = json_object();
  static const char *const str_keys[] = {"source", "conn", "dir", "side", "corr", "wall", "event"};
  static const int str_ix[] = {0, 1, 3, 4, 5, 6, 7};
  for (size_t i = 0; i < 7; i++) {
    if (!v[str_ix[i]].p)
      continue;
    json_t *x = ah__span_str(v[str_ix[i]]);
    if (!x) {
      json_decref(rec);
      return -1;
    }
    json_object_set_new(rec, str_keys[i], x);
  }
  json_t *seq = ah__span_int(v[2]);
  if (!seq) {
    json_decref(rec);
    return -1;
  }
  json_object_set_new(rec, "seq", seq);
  if (v[8].p) {
    json_t *p = v[8].p[0] == '{' ? payload_of(v[8]) : ah__span_json(v[8]);
    if (!p) {
      json_decref(rec);
      return -1;
    }
    json_object_set_new(rec, "payload", p);
  }
  on_observation(a, rec);
  json_decref(rec);
  return 0;
}

void ah__analysis_line(ah_analysis *a, const char *line, size_t len) {
  input_a *in = cur_input(a);
  in->lines++;
  while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
    len--;
  if (!len)
    return;
  if (fast_line(a, line, len) == 0)
    return;
  json_error_t je;
  json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(o)) {
    in->malformed++;
    json_decref(o);
    return;
  }
  if (json_object_get(o, "source") && json_object_get(o, "conn"))
    on_observation(a, o);
  else if (json_object_get(o, "kind") && json_object_get(o, "sessionId") && json_object_get(o, "seq"))
    on_event(a, o);
  else
    in->malformed++;
  json_decref(o);
}

/* ---- the report -----------------------------------------------------------------------------------------
 */

typedef struct cost_acc {
  ah_cost c;
  bool any;
} cost_acc;

/* A turn's usage by the rule of docs/usage.md: its round trips when they are complete (each attributed to
 * the model its server reported), else its end's sum (attributed when one model was reported). */
static json_t *turn_report(const ah_analysis *a, const session_a *s, const turn_a *t, ah_tokens *use,
                           ah_cost *cost) {
  ah_tokens rounds = {0};
  for (size_t i = 0; i < t->nrounds; i++)
    ah__tokens_add(&rounds, &t->rounds[i].t);
  bool rounds_complete =
      t->nrounds > 0 && (!t->has_end || !t->end_usage_ok ||
                         (rounds.input == t->end_usage.input && rounds.output == t->end_usage.output &&
                          (int64_t)t->nrounds >= t->end_usage.requests));
  json_t *notes = json_array();
  ah_cost c = {0};
  if (rounds_complete) {
    *use = rounds;
    for (size_t i = 0; i < t->nrounds; i++)
      ah__cost_add(&c, a->o.prices, t->provider, t->rounds[i].model, t->rounds[i].time, &t->rounds[i].t);
  } else if (t->has_end && t->end_usage_ok) {
    *use = t->end_usage;
    if (t->nrounds)
      json_array_append_new(notes, json_string("round trips incomplete: the end's sum is used"));
    ah__cost_add(&c, a->o.prices, t->provider, t->mixed ? NULL : t->model, t->ended, use);
  } else {
    memset(use, 0, sizeof *use);
  }
  if (!t->has_end)
    json_array_append_new(notes, json_string("no end observed"));
  if (!t->started[0])
    json_array_append_new(notes, json_string("no start observed"));
  json_t *o =
      json_pack("{s:s, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:o, s:i}", "turnId", t->id, "started",
                t->started[0] ? t->started : NULL, "ended", t->ended[0] ? t->ended : NULL, "reason",
                t->reason, "provider", t->provider, "requestedModel", t->requested, "model",
                t->mixed ? NULL : t->model, "usage", ah__tokens_json(use), "roundTrips", (int)t->nrounds);
  if (t->error)
    json_object_set_new(o, "error", json_string(t->error));
  if (a->o.prices)
    json_object_set_new(o, "cost", ah__cost_json(&c, a->o.prices));
  if (json_array_size(notes))
    json_object_set_new(o, "incomplete", notes);
  else
    json_decref(notes);
  cost->amount += c.amount;
  ah__tokens_add(&cost->priced, &c.priced);
  ah__tokens_add(&cost->unpriced, &c.unpriced);
  if (c.unpriced_items && !cost->why[0])
    snprintf(cost->why, sizeof cost->why, "%s", c.why);
  cost->unpriced_items += c.unpriced_items;
  (void)s;
  return o;
}

static int cmp_str(const void *x, const void *y) {
  return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* The report; with `with_turns` false each session's "turns" is left out (the streaming writer emits them
 * one by one, so that a large report is never whole in memory). */
static json_t *report_build(ah_analysis *a, bool with_turns) {
  json_t *issues = json_array();
  json_t *sessions = json_array();
  size_t n = a->nsessions;
  const char **ids = calloc(n + 1, sizeof *ids), **parents = calloc(n + 1, sizeof *parents);
  ah_tokens *own = calloc(n + 1, sizeof *own);
  ah_cost *costs = calloc(n + 1, sizeof *costs);
  if (!ids || !parents || !own || !costs)
    abort();
  /* per session, in id order (UUIDv7: creation order) */
  const char **order = calloc(n + 1, sizeof *order);
  for (size_t i = 0; i < n; i++)
    order[i] = a->sessions[i].id;
  qsort(order, n, sizeof *order, cmp_str);
  json_t *reports = json_object();
  for (size_t i = 0; i < n; i++) {
    session_a *s = &a->sessions[i];
    ids[i] = s->id;
    parents[i] = s->parent;
    json_t *turns = with_turns ? json_array() : NULL;
    for (size_t k = 0; k < s->nturns; k++) {
      ah_tokens u;
      json_t *t = turn_report(a, s, &s->turns[k], &u, &costs[i]);
      if (turns)
        json_array_append_new(turns, t);
      else
        json_decref(t);
      ah__tokens_add(&own[i], &u);
    }
    json_t *cov = json_object();
    int64_t first = s->seqs.n ? s->seqs.r[0][0] : 0, last = s->seqs.n ? s->seqs.r[s->seqs.n - 1][1] : 0;
    json_object_set_new(cov, "firstSeq", json_integer(first));
    json_object_set_new(cov, "lastSeq", json_integer(last));
    json_object_set_new(cov, "events", json_integer(s->events));
    json_t *gaps = ranges_gaps(&s->seqs);
    bool prefix = s->seqs.n && first > 1;
    if (!s->seqs.n)
      json_array_append_new(issues, json_sprintf("session %s: none of its events was observed", s->id));
    json_object_set_new(cov, "missingPrefix",
                        prefix ? json_pack("[i, I]", 1, (json_int_t)(first - 1)) : json_null());
    if (prefix)
      json_array_append_new(issues,
                            json_sprintf("session %s: events 1..%lld were not observed (missing prefix)",
                                         s->id, (long long)first - 1));
    size_t gi;
    json_t *g;
    json_array_foreach(gaps, gi, g) {
      json_array_append_new(issues, json_sprintf("session %s: events %lld..%lld were not observed", s->id,
                                                 (long long)json_integer_value(json_array_get(g, 0)),
                                                 (long long)json_integer_value(json_array_get(g, 1))));
    }
    json_object_set_new(cov, "gaps", gaps);
    json_object_set(cov, "unknownKinds", s->unknown_kinds);
    const char *uk;
    json_t *uv;
    json_object_foreach(s->unknown_kinds, uk, uv) {
      json_array_append_new(issues, json_sprintf("session %s: %lld event(s) of unknown kind %s kept opaque",
                                                 s->id, (long long)json_integer_value(uv), uk));
    }
    json_t *repeated = json_array();
    const char *ck;
    json_t *cv;
    json_object_foreach(s->calls, ck, cv) {
      if (json_integer_value(json_object_get(cv, "count")) >= a->o.repeat_threshold)
        json_array_append(repeated, cv);
    }
    json_t *reqs = json_array();
    for (size_t r = 0; r < a->nrequests; r++) {
      request_a *q = &a->requests[r];
      if (!q->session || strcmp(q->session, s->id) != 0)
        continue;
      json_t *qo = json_pack("{s:s, s:s?, s:s?, s:s?, s:s, s:s?, s:s?}", "id", q->id, "kind", q->kind,
                             "turnId", q->turn, "tool", q->tool, "state", q->state, "asked",
                             q->asked[0] ? q->asked : NULL, "resolved", q->resolved[0] ? q->resolved : NULL);
      if (q->by_conn)
        json_object_set_new(qo, "answeredBy",
                            json_pack("{s:s, s:s}", "source", q->by_source, "conn", q->by_conn));
      json_array_append_new(reqs, qo);
    }
    json_t *so = json_pack("{s:s, s:s?, s:O, s:o*, s:o, s:O, s:o, s:o, s:O, s:o}", "id", s->id, "parent",
                           s->parent, "children", s->children, "turns", turns, "usage",
                           ah__tokens_json(&own[i]), "toolFailures", s->failures, "repeatedCalls", repeated,
                           "requests", reqs, "hookRuns", s->hooks, "coverage", cov);
    if (a->o.prices)
      json_object_set_new(so, "cost", ah__cost_json(&costs[i], a->o.prices));
    json_object_set_new(reports, s->id, so);
  }
  for (size_t i = 0; i < n; i++) {
    json_t *so = json_object_get(reports, a->sessions[i].id);
    ah_tokens tree;
    size_t counted = ah__usage_tree(ids, parents, own, n, a->sessions[i].id, &tree);
    json_t *tu = ah__tokens_json(&tree);
    json_object_set_new(tu, "sessions", json_integer((json_int_t)counted));
    json_object_set_new(so, "treeUsage", tu);
    if (a->o.prices) {
      ah_cost tc = {0};
      for (size_t k = 0; k < n; k++) {
        /* k counts when i is k or one of its ancestors */
        const char *cur = ids[k];
        bool below = false;
        for (size_t step = 0; step <= n && cur && !below; step++) {
          if (strcmp(cur, a->sessions[i].id) == 0) {
            below = true;
            break;
          }
          json_t *ix = json_object_get(a->session_index, cur);
          cur = ix ? parents[json_integer_value(ix)] : NULL;
        }
        if (below) {
          tc.amount += costs[k].amount;
          ah__tokens_add(&tc.priced, &costs[k].priced);
          ah__tokens_add(&tc.unpriced, &costs[k].unpriced);
          tc.unpriced_items += costs[k].unpriced_items;
          if (!tc.why[0] && costs[k].why[0])
            snprintf(tc.why, sizeof tc.why, "%s", costs[k].why);
        }
      }
      json_object_set_new(so, "treeCost", ah__cost_json(&tc, a->o.prices));
    }
  }
  for (size_t i = 0; i < n; i++)
    json_array_append(sessions, json_object_get(reports, order[i]));
  json_decref(reports);
  /* requests pending (as of the end, or --as-of) */
  for (size_t r = 0; r < a->nrequests; r++)
    if (strcmp(a->requests[r].state, "pending") == 0)
      json_array_append_new(issues,
                            json_sprintf("request %s (%s) is pending: no answer observed", a->requests[r].id,
                                         a->requests[r].kind ? a->requests[r].kind : "?"));
  json_t *conns = json_array();
  for (size_t i = 0; i < a->nconns; i++) {
    conn_a *c = &a->conns[i];
    json_t *gaps = ranges_gaps(&c->seqs);
    int64_t first = c->seqs.n ? c->seqs.r[0][0] : 0;
    json_t *unknown = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(c->outstanding, k, v) json_array_append(unknown, v);
    json_t *co = json_pack("{s:s, s:s, s:I, s:s?, s:s?, s:o, s:I, s:b, s:b, s:o, s:O}", "source", c->source,
                           "conn", c->conn, "records", (json_int_t)c->records, "first",
                           c->first[0] ? c->first : NULL, "last", c->last[0] ? c->last : NULL, "gaps", gaps,
                           "losses", (json_int_t)c->losses, "opened", c->opened, "closed", c->closed,
                           "unknownOutcome", unknown, "unknownMethods", c->unknown_methods);
    if (first > 1) {
      json_object_set_new(co, "missingPrefix", json_pack("[i, I]", 1, (json_int_t)(first - 1)));
      json_array_append_new(issues, json_sprintf("connection %s %s: records 1..%lld are missing", c->source,
                                                 c->conn, (long long)first - 1));
    }
    size_t gi;
    json_t *g;
    json_array_foreach(gaps, gi, g) {
      json_array_append_new(
          issues, json_sprintf("connection %s %s: records %lld..%lld are missing (no recording)", c->source,
                               c->conn, (long long)json_integer_value(json_array_get(g, 0)),
                               (long long)json_integer_value(json_array_get(g, 1))));
    }
    if (c->losses)
      json_array_append_new(issues, json_sprintf("connection %s %s: lost %lld time(s)", c->source, c->conn,
                                                 (long long)c->losses));
    if (c->opened && !c->closed && !a->as_of[0])
      json_array_append_new(issues,
                            json_sprintf("connection %s %s: no close recorded (the recording may have "
                                         "been cut)",
                                         c->source, c->conn));
    if (json_array_size(unknown))
      json_array_append_new(issues,
                            json_sprintf("connection %s %s: %zu request(s) sent with no answer observed "
                                         "(outcome unknown)",
                                         c->source, c->conn, json_array_size(unknown)));
    json_object_foreach(c->unknown_methods, k, v) {
      json_array_append_new(issues,
                            json_sprintf("connection %s %s: %lld message(s) of unknown method %s kept opaque",
                                         c->source, c->conn, (long long)json_integer_value(v), k));
    }
    json_array_append_new(conns, co);
  }
  json_t *inputs = json_array();
  for (size_t i = 0; i < a->ninputs; i++) {
    input_a *in = &a->inputs[i];
    json_t *io = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "file", in->name, "lines", (json_int_t)in->lines,
                           "records", (json_int_t)in->records, "events", (json_int_t)in->events, "duplicates",
                           (json_int_t)in->duplicates, "malformed", (json_int_t)in->malformed);
    if (in->skipped_after)
      json_object_set_new(io, "afterAsOf", json_integer(in->skipped_after));
    if (in->meta)
      json_object_set(io, "metadata", in->meta);
    if (in->malformed)
      json_array_append_new(
          issues, json_sprintf("%s: %lld line(s) could not be read", in->name, (long long)in->malformed));
    json_array_append_new(inputs, io);
  }
  json_t *rep = json_pack("{s:s, s:i, s:s?, s:s?, s:o, s:o, s:o, s:{s:b, s:o}}", "format",
                          "agenthost.analysis", "version", 1, "asOf", a->as_of[0] ? a->as_of : NULL, "prices",
                          ah__prices_name(a->o.prices), "inputs", inputs, "sessions", sessions, "connections",
                          conns, "coverage", "complete", json_array_size(issues) == 0, "issues", issues);
  free(ids);
  free(parents);
  free(own);
  free(costs);
  free(order);
  return rep;
}

json_t *ah__analysis_report(ah_analysis *a) {
  return report_build(a, true);
}

/* The JSON report written compact, each session's turns emitted one at a time. */
static int write_json(ah_analysis *a, FILE *out) {
  json_t *rep = report_build(a, false);
  const char *k;
  json_t *v;
  bool first = true;
  fputc('{', out);
  json_object_foreach(rep, k, v) {
    json_t *key = json_string(k);
    if (!first)
      fputc(',', out);
    first = false;
    json_dumpf(key, out, JSON_ENCODE_ANY);
    json_decref(key);
    fputc(':', out);
    if (strcmp(k, "sessions") != 0) {
      json_dumpf(v, out, JSON_COMPACT | JSON_ENCODE_ANY);
      continue;
    }
    fputc('[', out);
    size_t i;
    json_t *so;
    json_array_foreach(v, i, so) {
      char *text = json_dumps(so, JSON_COMPACT);
      size_t n = text ? strlen(text) : 0;
      if (n < 2) {
        free(text);
        json_decref(rep);
        return -1;
      }
      if (i)
        fputc(',', out);
      fwrite(text, 1, n - 1, out); /* without its closing brace: the turns follow */
      free(text);
      fputs(",\"turns\":[", out);
      session_a *s = &a->sessions[json_integer_value(json_object_get(a->session_index, sget(so, "id")))];
      ah_cost sink = {0};
      for (size_t t = 0; t < s->nturns; t++) {
        ah_tokens u;
        json_t *tj = turn_report(a, s, &s->turns[t], &u, &sink);
        if (t)
          fputc(',', out);
        json_dumpf(tj, out, JSON_COMPACT);
        json_decref(tj);
      }
      fputs("]}", out);
    }
    fputc(']', out);
  }
  fputs("}\n", out);
  json_decref(rep);
  return ferror(out) ? -1 : 0;
}

/* ---- text -----------------------------------------------------------------------------------------------
 */

static void print_tokens(FILE *out, const json_t *u) {
  fprintf(out, "in %lld (cached %lld)  out %lld (reasoning %lld)  requests %lld",
          (long long)json_integer_value(json_object_get(u, "inputTokens")),
          (long long)json_integer_value(json_object_get(u, "cachedInputTokens")),
          (long long)json_integer_value(json_object_get(u, "outputTokens")),
          (long long)json_integer_value(json_object_get(u, "reasoningTokens")),
          (long long)json_integer_value(json_object_get(u, "requests")));
}

static void print_cost(FILE *out, const json_t *c) {
  if (!c)
    return;
  fprintf(out, "  cost %s %s", sget(c, "amount"), sget(c, "currency"));
  if (json_object_get(c, "unpricedItems"))
    fprintf(out, " + unpriced (%lld item(s): %s)",
            (long long)json_integer_value(json_object_get(c, "unpricedItems")), sget(c, "unpricedWhy"));
}

/* Hook runs: one line per hook and point (runs, outcomes, the longest), then each run that denied, failed
 * or was cancelled with its reason. */
static void print_hooks(FILE *out, const json_t *runs) {
  json_t *by = json_object(); /* "hook (event)" → {runs, outcomes{}, maxMs} */
  size_t i;
  json_t *r;
  json_array_foreach(runs, i, r) {
    char key[300];
    snprintf(key, sizeof key, "%.200s (%.60s)", sget(r, "hook"), sget(r, "event") ? sget(r, "event") : "?");
    json_t *h = json_object_get(by, key);
    if (!h) {
      h = json_pack("{s:i, s:{}, s:i}", "runs", 0, "outcomes", "maxMs", 0);
      json_object_set_new(by, key, h);
    }
    json_object_set_new(h, "runs", json_integer(json_integer_value(json_object_get(h, "runs")) + 1));
    count(json_object_get(h, "outcomes"), sget(r, "outcome"));
    json_int_t ms = json_integer_value(json_object_get(r, "durationMs"));
    if (ms > json_integer_value(json_object_get(h, "maxMs")))
      json_object_set_new(h, "maxMs", json_integer(ms));
  }
  const char *k;
  json_t *h;
  json_object_foreach(by, k, h) {
    fprintf(out, "  hook %s: %lld run(s)", k, (long long)json_integer_value(json_object_get(h, "runs")));
    const char *ok;
    json_t *ov;
    json_object_foreach(json_object_get(h, "outcomes"), ok, ov)
        fprintf(out, ", %s %lld", ok, (long long)json_integer_value(ov));
    fprintf(out, ", longest %lld ms\n", (long long)json_integer_value(json_object_get(h, "maxMs")));
  }
  json_decref(by);
  json_array_foreach(runs, i, r) {
    const char *o = sget(r, "outcome");
    if (strcmp(o, "deny") != 0 && strcmp(o, "error") != 0 && strcmp(o, "cancelled") != 0)
      continue;
    fprintf(out, "  hook %s %s%s%s: %s", sget(r, "hook"), o, sget(r, "tool") ? " on " : "",
            sget(r, "tool") ? sget(r, "tool") : "",
            sget(r, "reason")  ? sget(r, "reason")
            : sget(r, "error") ? sget(r, "error")
                               : "no reason given");
    if (sget(r, "onError"))
      fprintf(out, " (on_error = %s)", sget(r, "onError"));
    fputc('\n', out);
  }
}

void ah__analysis_print(const json_t *rep, FILE *out) {
  size_t i;
  json_t *s;
  if (sget(rep, "asOf"))
    fprintf(out, "as of %s\n", sget(rep, "asOf"));
  if (sget(rep, "prices"))
    fprintf(out, "prices: %s\n", sget(rep, "prices"));
  json_array_foreach(json_object_get(rep, "sessions"), i, s) {
    fprintf(out, "\nsession %s", sget(s, "id"));
    if (sget(s, "parent"))
      fprintf(out, " (child of %s)", sget(s, "parent"));
    fputc('\n', out);
    size_t k;
    json_t *t;
    json_array_foreach(json_object_get(s, "turns"), k, t) {
      fprintf(out, "  turn %s  %s  %-10s ", sget(t, "turnId"), sget(t, "started") ? sget(t, "started") : "?",
              sget(t, "reason") ? sget(t, "reason") : "(no end)");
      if (sget(t, "model"))
        fprintf(out, "model %s  ", sget(t, "model"));
      print_tokens(out, json_object_get(t, "usage"));
      print_cost(out, json_object_get(t, "cost"));
      fputc('\n', out);
    }
    fprintf(out, "  total: ");
    print_tokens(out, json_object_get(s, "usage"));
    print_cost(out, json_object_get(s, "cost"));
    fputc('\n', out);
    if (json_array_size(json_object_get(s, "children"))) {
      fprintf(out, "  tree (%lld sessions): ",
              (long long)json_integer_value(json_object_get(json_object_get(s, "treeUsage"), "sessions")));
      print_tokens(out, json_object_get(s, "treeUsage"));
      print_cost(out, json_object_get(s, "treeCost"));
      fputc('\n', out);
    }
    json_array_foreach(json_object_get(s, "requests"), k, t) {
      fprintf(out, "  %s %s%s%s: %s", sget(t, "kind") ? sget(t, "kind") : "request", sget(t, "id"),
              sget(t, "tool") ? " " : "", sget(t, "tool") ? sget(t, "tool") : "", sget(t, "state"));
      const json_t *by = json_object_get(t, "answeredBy");
      if (by)
        fprintf(out, " by %s %s", sget(by, "source"), sget(by, "conn"));
      fputc('\n', out);
    }
    json_array_foreach(json_object_get(s, "toolFailures"), k, t) {
      fprintf(out, "  tool failure: %s (%s)\n", sget(t, "name") ? sget(t, "name") : "?",
              sget(t, "error") ? sget(t, "error") : "no message");
    }
    json_array_foreach(json_object_get(s, "repeatedCalls"), k, t) {
      fprintf(out, "  repeated call: %s × %lld (identical arguments)\n", sget(t, "name"),
              (long long)json_integer_value(json_object_get(t, "count")));
    }
    print_hooks(out, json_object_get(s, "hookRuns"));
  }
  const json_t *cov = json_object_get(rep, "coverage");
  fprintf(out, "\ncoverage: %s\n",
          json_is_true(json_object_get(cov, "complete")) ? "complete" : "incomplete");
  json_array_foreach(json_object_get(cov, "issues"), i, s) fprintf(out, "  - %s\n", json_string_value(s));
}

/* ---- the command ----------------------------------------------------------------------------------------
 */

static json_t *meta_beside(const char *path) {
  char m[4200];
  size_t n = strlen(path);
  if (n > 6 && strcmp(path + n - 6, ".jsonl") == 0)
    snprintf(m, sizeof m, "%.*s.meta.json", (int)(n - 6), path);
  else
    snprintf(m, sizeof m, "%s.meta.json", path);
  return json_load_file(m, JSON_REJECT_DUPLICATES, NULL);
}

static int read_file(ah_analysis *a, const char *path) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "agenthost analyze: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  json_t *meta = f == stdin ? NULL : meta_beside(path);
  ah__analysis_input(a, path, meta);
  json_decref(meta);
  size_t cap = 1 << 20;
  char *buf = malloc(cap);
  size_t len = 0;
  bool too_long = false;
  if (!buf)
    abort();
  for (;;) {
    size_t got = fread(buf + len, 1, cap - len, f);
    if (got == 0 && len == 0)
      break;
    size_t end = len + got, start = 0;
    for (;;) {
      char *nl = memchr(buf + start, '\n', end - start);
      if (!nl)
        break;
      if (too_long) { /* the end of a line longer than 64 MiB: counted malformed once */
        too_long = false;
        cur_input(a)->lines++;
        cur_input(a)->malformed++;
      } else {
        ah__analysis_line(a, buf + start, (size_t)(nl - (buf + start)));
      }
      start = (size_t)(nl - buf) + 1;
    }
    memmove(buf, buf + start, end - start);
    len = end - start;
    if (got == 0) {
      if (len && !too_long)
        ah__analysis_line(a, buf, len); /* a last line without a newline */
      break;
    }
    if (len == cap) {
      if (cap >= (64u << 20)) {
        too_long = true;
        len = 0;
      } else {
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb)
          abort();
        buf = nb;
      }
    }
  }
  bool bad = ferror(f);
  free(buf);
  if (f != stdin)
    fclose(f);
  if (bad) {
    fprintf(stderr, "agenthost analyze: cannot read %s\n", path);
    return -1;
  }
  return 0;
}

static const char analyze_usage[] =
    "usage: agenthost analyze [--json] [--prices FILE] [--as-of TIME] [--repeat N] FILE...\n"
    "  FILE: recordings (observation JSONL) or session exports; - reads stdin\n"
    "  --prices FILE  a price table: costs at the rates in effect when the usage happened\n"
    "  --as-of TIME   ignore what happened after TIME (RFC 3339 UTC, or a date: its end)\n"
    "  --repeat N     report identical tool calls made N times or more (default 3)\n";

int ah__cmd_analyze(int argc, char **argv) {
  bool as_json = false;
  const char *prices_path = NULL, *as_of = NULL;
  int repeat = 3;
  int i = 0;
  for (; i < argc; i++) {
    const char *x = argv[i];
    if (strcmp(x, "--json") == 0) {
      as_json = true;
    } else if ((strcmp(x, "--prices") == 0 || strcmp(x, "--as-of") == 0 || strcmp(x, "--repeat") == 0) &&
               i + 1 < argc) {
      const char *v = argv[++i];
      if (x[2] == 'p') {
        prices_path = v;
      } else if (x[2] == 'a') {
        as_of = v;
      } else {
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 1000000) {
          fprintf(stderr, "agenthost analyze: --repeat needs a whole number from 1\n");
          return 2;
        }
        repeat = (int)n;
      }
    } else if (strcmp(x, "--") == 0) {
      i++;
      break;
    } else if (x[0] == '-' && x[1]) {
      fputs(analyze_usage, stderr);
      return 2;
    } else {
      break;
    }
  }
  if (i >= argc) {
    fputs(analyze_usage, stderr);
    return 2;
  }
  if (as_of) {
    size_t n = strlen(as_of);
    bool ok = (n == 10 || (n >= 20 && as_of[n - 1] == 'Z')) && as_of[4] == '-' && as_of[7] == '-';
    if (!ok) {
      fprintf(stderr, "agenthost analyze: --as-of needs a date YYYY-MM-DD or a UTC time such as "
                      "2026-12-01T12:00:00.000Z\n");
      return 2;
    }
  }
  ah_prices *prices = NULL;
  if (prices_path) {
    char why[320];
    prices = ah__prices_load(prices_path, why, sizeof why);
    if (!prices) {
      fprintf(stderr, "agenthost analyze: %s\n", why);
      return 2;
    }
  }
  ah_analysis_opts o = {.prices = prices, .as_of = as_of, .repeat_threshold = repeat};
  ah_analysis *a = ah__analysis_new(&o);
  int rc = 0;
  for (; i < argc && rc == 0; i++)
    if (read_file(a, argv[i]) != 0)
      rc = 2;
  if (rc == 0) {
    if (as_json) {
      if (write_json(a, stdout) != 0)
        rc = 2;
    } else {
      json_t *rep = ah__analysis_report(a);
      ah__analysis_print(rep, stdout);
      json_decref(rep);
    }
  }
  ah__analysis_free(a);
  ah__prices_free(prices);
  return rc;
}
