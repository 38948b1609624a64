/* The methods session.* and request.*: validation of the parameters, answers for store failures, and the
 * calls into the live sessions, turns and requests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session.h"

#define SM(data) ((ah_sessions *)(data))

/* Every session method needs the store; a store that cannot be opened fails them all the same way. */
static bool store_ready(ah_call *call, void *data) {
  if (ah__sm_store(SM(data)))
    return true;
  ah__call_error(call, AH_EIO, "the store cannot be opened (see the host's log)", NULL);
  return false;
}

/* A failed read is answered as an error (AH_EIO with the store's health), never as an empty or null
 * success. */
static void answer_read_error(ah_call *call, ah_sessions *m) {
  char detail[300];
  int h = ah__store_health(ah__sm_store(m), detail, sizeof detail);
  char msg[400];
  snprintf(msg, sizeof msg, "the store could not be read%s%s", h != AH_STORE_OK ? ": " : "",
           h != AH_STORE_OK ? detail : "");
  ah__call_error(call, AH_EIO, msg, NULL);
}

/* A method's store read (never on the loop: host/store.h): `then` runs with the results of the queries once
 * they are read, with the call's params (kept until then); a failed read is answered as an error. */
typedef void (*read_then)(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results);

typedef struct method_read_ctx {
  ah_call *call;
  ah_sessions *m;
  json_t *p;
  read_then then;
} method_read_ctx;

static void method_read_done(int status, const json_t *results, void *arg) {
  method_read_ctx *c = arg;
  if (status == AH_EIO)
    answer_read_error(c->call, c->m);
  else if (status)
    ah__call_error(c->call, status, ah_strerror(status), NULL);
  else
    c->then(c->call, c->m, c->p, results);
  json_decref(c->p);
  free(c);
}

static void method_read(ah_call *call, ah_sessions *m, const json_t *p, const ah_store_query *q, size_t n,
                        read_then then) {
  method_read_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  *c = (method_read_ctx){call, m, json_incref((json_t *)p), then};
  int rc = ah__store_read(ah__sm_store(m), q, n, method_read_done, c);
  if (rc) {
    json_decref(c->p);
    free(c);
    ah__call_error(call, rc, rc == AH_ECLOSED ? "the host is stopping" : ah_strerror(rc), NULL);
  }
}

/* The session row a read found (results[i]), or NULL after answering "no such session". */
static const json_t *found_row(ah_call *call, const json_t *results, size_t i) {
  const json_t *row = json_array_get(results, i);
  if (json_is_object(row))
    return row;
  ah__call_error(call, AH_ENOENT, "no such session", NULL);
  return NULL;
}

/* A method about one session: params.sessionId is required (answered otherwise). */
static const char *session_param(ah_call *call, const json_t *p) {
  const char *id = str(p, "sessionId");
  if (!id)
    ah__call_error(call, AH_EINVAL, "params.sessionId is required", NULL);
  return id;
}

static bool absolute_dir(const char *p) {
  struct stat st;
  return p && p[0] == '/' && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void reply_created(int status, session *s, void *arg) {
  ah_call *call = arg;
  if (status)
    ah__call_error(call, status,
                   status == AH_EAGENTBUSY ? "the session is owned by another process"
                                           : "cannot create the session",
                   NULL);
  else
    ah__call_reply(call, json_pack("{s:s, s:o, s:o}", "sessionId", s->id, "session",
                                   ah__sm_public_row(s->row, "idle"), "options", ah__session_options(s)));
}

/* The provider a session.create asks for, or the host's default. */
static const char *provider_asked(ah_sessions *m, const json_t *p) {
  const char *provider = str(p, "provider");
  const ah_config *cfg = ah__host_config(m->host);
  return provider ? provider : cfg && cfg->default_provider ? cfg->default_provider : "echo";
}

static void create(ah_call *call, ah_sessions *m, const json_t *p, int depth) {
  int rc = ah__live_create(m, str(p, "cwd"), provider_asked(m, p), str(p, "model"), str(p, "title"),
                           str(p, "parent"), false, depth, reply_created, call);
  if (rc)
    ah__call_error(call, rc, ah_strerror(rc), NULL);
}

static void create_below(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const json_t *prow = json_array_get(results, 0);
  if (!json_is_object(prow)) {
    ah__call_error(call, AH_ENOENT, "params.parent: no such session", NULL);
    return;
  }
  int depth = (int)json_integer_value(json_object_get(prow, "depth")) + 1;
  if (depth > m->max_depth) {
    ah__call_error(call, AH_EINVAL, "params.parent: the subagent depth limit is reached", NULL);
    return;
  }
  create(call, m, p, depth);
}

static void m_create(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *cwd = str(p, "cwd");
  const char *provider = str(p, "provider");
  const char *model = str(p, "model");
  const char *title = str(p, "title");
  const char *parent = str(p, "parent");
  if (!absolute_dir(cwd)) {
    ah__call_error(call, AH_EINVAL, "params.cwd: an absolute path to an existing directory is required",
                   NULL);
    return;
  }
  if ((json_object_get(p, "provider") && !provider) || (json_object_get(p, "model") && !model) ||
      (json_object_get(p, "title") && !title) || (json_object_get(p, "parent") && !parent)) {
    ah__call_error(call, AH_EINVAL, "params: provider, model, title and parent must be strings", NULL);
    return;
  }
  if (!ah__turn_provider(m, provider_asked(m, p), NULL, NULL)) {
    ah__call_error(call, AH_EUNAVAILABLE, "params.provider: no such provider is available", NULL);
    return;
  }
  if (parent)
    method_read(call, m, p, &(ah_store_query){.kind = AH_STORE_Q_SESSION, .id = parent}, 1, create_below);
  else
    create(call, m, p, 0);
}

static int parse_limit(const json_t *p, size_t def, size_t max, size_t *out) {
  json_t *l = json_object_get(p, "limit");
  if (!l) {
    *out = def;
    return 0;
  }
  if (!json_is_integer(l) || json_integer_value(l) < 1 || (size_t)json_integer_value(l) > max)
    return AH_EINVAL;
  *out = (size_t)json_integer_value(l);
  return 0;
}

/* "HOST:PID" of a lease owner ("HOST:PID:NONCE"). */
static json_t *owner_shown(const char *owner) {
  const char *c2 = owner ? strchr(owner, ':') : NULL;
  c2 = c2 ? strchr(c2 + 1, ':') : NULL;
  return owner ? json_stringn(owner, c2 ? (size_t)(c2 - owner) : strlen(owner)) : json_null();
}

static json_t *live_status_row(ah_sessions *m, const json_t *row, const json_t *tree) {
  session *s = ah__live_find(m, str(row, "id"));
  const char *holder = str(row, "leaseOwner");
  /* With a shared store a session another host runs shows the status that host stored. */
  bool elsewhere = ah__hosts_active(m) && !(s && s->ready) && holder && strcmp(holder, m->owner) != 0 &&
                   !json_is_true(json_object_get(row, "closed"));
  const char *status = s && s->ready                                  ? status_of(s)
                       : json_is_true(json_object_get(row, "closed")) ? "closed"
                       : elsewhere && str(row, "status")              ? str(row, "status")
                                                                      : "idle";
  json_t *r = ah__sm_public_row(row, status);
  json_object_set_new(r, "live", json_boolean(s && s->ready));
  if (ah__hosts_active(m)) /* which host runs it: this one, another (HOST:PID), or none */
    json_object_set_new(r, "owner",
                        s && s->ready ? owner_shown(m->owner)
                        : elsewhere   ? owner_shown(holder)
                                      : json_null());
  /* A live session's own fields may be ahead of the store (ah__session_update is written behind). */
  static const char *const own[] = {"title", "tags", "policy", "model", "settings", "usage"};
  for (size_t i = 0; s && s->ready && i < sizeof own / sizeof own[0]; i++)
    if (json_object_get(s->row, own[i]))
      json_object_set(r, own[i], json_object_get(s->row, own[i]));
  ah__usage_public(m, r, r, tree);
  return r;
}

/* The page of rows read, then each one's tree (its usage below it). */
static void listed_trees(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const json_t *rows = json_object_get(p, "rows");
  size_t limit = (size_t)json_integer_value(json_object_get(p, "limit"));
  json_t *out = json_array();
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(rows, i, row) {
    if (i < limit)
      json_array_append_new(out, live_status_row(m, row, json_array_get(results, i)));
  }
  json_t *next = json_array_size(rows) > limit ? json_object_get(json_array_get(out, limit - 1), "id") : NULL;
  ah__call_reply(call, json_pack("{s:o, s:O?}", "sessions", out, "nextCursor", next));
}

static void listed(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const json_t *rows = json_array_get(results, 0);
  size_t limit = (size_t)json_integer_value(json_object_get(p, "limit"));
  size_t n = json_array_size(rows) < limit ? json_array_size(rows) : limit;
  ah_store_query *q = calloc(n ? n : 1, sizeof *q);
  json_t *lp = json_pack("{s:O, s:I}", "rows", rows, "limit", (json_int_t)limit);
  if (!q || !lp) {
    free(q);
    json_decref(lp);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  for (size_t i = 0; i < n; i++)
    q[i] = (ah_store_query){.kind = AH_STORE_Q_TREE, .id = str(json_array_get(rows, i), "id")};
  method_read(call, m, lp, q, n, listed_trees);
  free(q);
  json_decref(lp);
}

static void m_list(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  size_t limit = 0;
  json_t *cursor = json_object_get(p, "cursor");
  if (parse_limit(p, 50, 500, &limit) || (cursor && !json_is_string(cursor))) {
    ah__call_error(call, AH_EINVAL, "params: cursor must be a string and limit an integer in 1..500", NULL);
    return;
  }
  json_t *lp = json_pack("{s:O?, s:I}", "cursor", cursor, "limit", (json_int_t)limit);
  method_read(
      call, m, lp,
      &(ah_store_query){.kind = AH_STORE_Q_SESSIONS, .id = json_string_value(cursor), .limit = limit + 1}, 1,
      listed);
  json_decref(lp);
}

static void got(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  (void)p;
  const json_t *row = found_row(call, results, 0);
  if (!row)
    return;
  json_t *shown = live_status_row(m, row, json_array_get(results, 1));
  ah__call_reply(call,
                 json_pack("{s:o, s:o}", "session", shown, "options", ah__session_options_of(m, shown)));
}

/* A session's row and its tree (live_status_row). */
static void read_shown(ah_call *call, ah_sessions *m, const json_t *p, read_then then) {
  const char *id = session_param(call, p);
  if (id)
    method_read(
        call, m, p,
        (ah_store_query[]){{.kind = AH_STORE_Q_SESSION, .id = id}, {.kind = AH_STORE_Q_TREE, .id = id}}, 2,
        then);
}

static void m_get(ah_call *call, const json_t *p, void *data) {
  if (store_ready(call, data))
    read_shown(call, SM(data), p, got);
}

static void history_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  (void)m;
  if (!found_row(call, results, 0))
    return;
  size_t limit = 0;
  parse_limit(p, 200, 1000, &limit);
  json_t *events = json_deep_copy(json_array_get(results, 1));
  json_t *next = NULL;
  if (json_array_size(events) > limit) {
    json_array_remove(events, limit);
    next = json_object_get(json_array_get(events, limit - 1), "seq");
  }
  ah__call_reply(call, json_pack("{s:o, s:O?}", "events", events, "nextAfterSeq", next));
}

static void m_history(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  /* A pure store read: never wakes an agent, never changes state. */
  ah_sessions *m = SM(data);
  const char *id = str(p, "sessionId");
  json_t *after = json_object_get(p, "afterSeq");
  size_t limit = 0;
  if (!id || (after && (!json_is_integer(after) || json_integer_value(after) < 0)) ||
      parse_limit(p, 200, 1000, &limit)) {
    ah__call_error(call, AH_EINVAL, "params: sessionId (string), afterSeq (integer ≥ 0), limit (1..1000)",
                   NULL);
    return;
  }
  method_read(call, m, p,
              (ah_store_query[]){{.kind = AH_STORE_Q_SESSION, .id = id},
                                 {.kind = AH_STORE_Q_EVENTS,
                                  .id = id,
                                  .after = after ? json_integer_value(after) : 0,
                                  .limit = limit + 1}},
              2, history_read);
}

/* session.export: the session's events as JSON lines, read page by page (each page one read). */
typedef struct export_ctx {
  ah_call *call;
  ah_sessions *m;
  char *id;
  char *buf;
  size_t len, cap;
  int64_t after;
  bool found; /* the session's row was read */
} export_ctx;

static void export_free(export_ctx *c) {
  free(c->id);
  free(c->buf);
  free(c);
}

static void export_next(export_ctx *c);

/* Append the page's events as lines; false when out of memory. */
static bool export_append(export_ctx *c, const json_t *page) {
  size_t i = 0;
  json_t *ev = NULL;
  json_array_foreach(page, i, ev) {
    char *line = json_dumps(ev, JSON_COMPACT);
    size_t n = line ? strlen(line) : 0;
    if (!line)
      return false;
    if (c->len + n + 2 > c->cap) {
      size_t cap = c->cap ? c->cap : 4096;
      while (c->len + n + 2 > cap)
        cap *= 2;
      char *grown = realloc(c->buf, cap);
      if (!grown) {
        free(line);
        return false;
      }
      c->buf = grown;
      c->cap = cap;
    }
    memcpy(c->buf + c->len, line, n);
    c->len += n;
    c->buf[c->len++] = '\n';
    free(line);
    c->after = json_integer_value(json_object_get(ev, "seq"));
  }
  return true;
}

static void export_page(int status, const json_t *results, void *arg) {
  export_ctx *c = arg;
  if (status) {
    if (status == AH_EIO)
      answer_read_error(c->call, c->m);
    else
      ah__call_error(c->call, status, ah_strerror(status), NULL);
    export_free(c);
    return;
  }
  size_t k = 0;
  if (!c->found) {
    if (!found_row(c->call, results, 0)) {
      export_free(c);
      return;
    }
    c->found = true;
    k = 1;
  }
  const json_t *page = json_array_get(results, k);
  if (!export_append(c, page)) {
    ah__call_error(c->call, AH_ENOMEM, "out of memory", NULL);
    export_free(c);
  } else if (json_array_size(page) == 1000) {
    export_next(c);
  } else {
    ah__call_reply(c->call, json_pack("{s:s%}", "jsonl", c->buf ? c->buf : "", c->len));
    export_free(c);
  }
}

static void export_next(export_ctx *c) {
  ah_store_query q[2] = {{.kind = AH_STORE_Q_SESSION, .id = c->id},
                         {.kind = AH_STORE_Q_EVENTS, .id = c->id, .after = c->after, .limit = 1000}};
  int rc = ah__store_read(ah__sm_store(c->m), c->found ? q + 1 : q, c->found ? 1 : 2, export_page, c);
  if (rc) {
    ah__call_error(c->call, rc, rc == AH_ECLOSED ? "the host is stopping" : ah_strerror(rc), NULL);
    export_free(c);
  }
}

static void m_export(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = session_param(call, p);
  if (!id)
    return;
  export_ctx *c = calloc(1, sizeof *c);
  if (!c || !(c->id = strdup(id))) {
    free(c);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  c->m = SM(data);
  export_next(c);
}

typedef struct prompt_ctx {
  ah_call *call;
  json_t *content;
  ah_sessions *m;
  char *id;
} prompt_ctx;

static void prompt_written(session *s, int status, const json_t *event, void *arg) {
  ah_call *call = arg;
  if (status) {
    /* No receipt, no run: take the prompt out of the queue, or end the turn that claimed it already. */
    const char *mid = event ? str(event, "messageId") : NULL;
    if (mid && s->turn && s->turn->message_id && strcmp(s->turn->message_id, mid) == 0 && s->turn->cancel)
      ah__cancel_trip(s->turn->cancel);
    AH__LIST_EACH(it, &s->queue) {
      queued *q = AH__CONTAINER(it, queued, link);
      if (mid && strcmp(q->message_id, mid) == 0) {
        ah__list_remove(&q->link);
        free(q->message_id);
        json_decref(q->content);
        free(q);
        break;
      }
    }
    ah__call_error(call, status, "the prompt could not be stored", NULL);
    return;
  }
  ah__call_reply(call, json_pack("{s:s, s:s}", "sessionId", s->id, "messageId", str(event, "messageId")));
  ah__turn_claim(s);
}

static void prompt_found(int status, session *s, void *arg) {
  prompt_ctx *c = arg;
  if (status == AH_EAGENTBUSY && c->m && ah__hosts_active(c->m)) {
    /* Another live host runs it: the prompt is posted for it (acknowledged once stored). */
    ah__hosts_post_prompt(c->m, c->id, c->content, c->call);
    free(c->id);
    free(c);
    return;
  }
  if (status) {
    ah__call_error(c->call, status,
                   status == AH_ENOENT       ? "no such session"
                   : status == AH_ECLOSED    ? "the session is closed"
                   : status == AH_EAGENTBUSY ? "the session is owned by another process"
                   : status == AH_EUNAVAILABLE
                       ? "the session's working directory does not exist on this host: it runs where its "
                         "workspace is"
                       : ah_strerror(status),
                   NULL);
  } else {
    ah__live_enqueue(s, json_incref(c->content), prompt_written, c->call, NULL);
  }
  json_decref(c->content);
  free(c->id);
  free(c);
}

static json_t *prompt_content(const json_t *p, const char **why) {
  json_t *text = json_object_get(p, "text");
  json_t *content = json_object_get(p, "content");
  if ((text != NULL) == (content != NULL)) {
    *why = "params: exactly one of text (string) or content (array of blocks) is required";
    return NULL;
  }
  if (text) {
    if (!json_is_string(text)) {
      *why = "params.text: must be a string";
      return NULL;
    }
    return json_pack("[{s:s, s:O}]", "type", "text", "text", text);
  }
  if (!json_is_array(content) || json_array_size(content) == 0 || json_array_size(content) > 1000) {
    *why = "params.content: a non-empty array of content blocks is required";
    return NULL;
  }
  size_t i = 0;
  json_t *b = NULL;
  json_array_foreach(content, i, b) {
    const char *type = str(b, "type");
    bool ok = type && ((strcmp(type, "text") == 0 && json_is_string(json_object_get(b, "text"))) ||
                       (strcmp(type, "resource_link") == 0 && json_is_string(json_object_get(b, "uri")) &&
                        json_is_string(json_object_get(b, "name"))));
    if (!ok) {
      *why = "params.content: blocks must be {type:\"text\", text} or {type:\"resource_link\", uri, name}";
      return NULL;
    }
  }
  return json_deep_copy(content);
}

static void m_prompt(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  /* A store found damaged takes no more work it may not keep: the prompt is refused, not acknowledged. */
  char detail[300];
  if (ah__store_health(ah__sm_store(m), detail, sizeof detail) == AH_STORE_DAMAGED) {
    char msg[400];
    snprintf(msg, sizeof msg, "the store is damaged (%s): prompts are refused until it is repaired", detail);
    ah__call_error(call, AH_EUNAVAILABLE, msg, NULL);
    return;
  }
  const char *id = str(p, "sessionId");
  const char *why = NULL;
  json_t *content = id ? prompt_content(p, &why) : NULL;
  if (!content) {
    ah__call_error(call, AH_EINVAL, id ? why : "params.sessionId is required", NULL);
    return;
  }
  prompt_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    json_decref(content);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  c->content = content;
  c->m = m;
  c->id = strdup(id);
  ah__live_lookup(m, id, prompt_found, c);
}

static void cancel_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results);

/* A cancel of a session running here trips its turn; one another host runs is posted for it. `row`: the
 * session's stored row once read (NULL: not read yet). */
static void cancel(ah_call *call, ah_sessions *m, const json_t *p, const json_t *row) {
  const char *id = str(p, "sessionId");
  session *s = ah__live_find(m, id);
  bool cancelled = s && s->ready && s->turn && !s->turn->ended && !s->turn->cancelled;
  if (cancelled) {
    ah__cancel_trip(s->turn->cancel);
  } else if (!s && !row) {
    method_read(call, m, p, &(ah_store_query){.kind = AH_STORE_Q_SESSION, .id = id}, 1, cancel_read);
    return;
  } else if (!s) {
    /* Run by another host: the cancel is posted for it (acknowledged once stored). */
    const char *holder = str(row, "leaseOwner");
    if (ah__hosts_active(m) && holder && strcmp(holder, m->owner) != 0 &&
        !json_is_true(json_object_get(row, "closed"))) {
      ah__hosts_post_cancel(m, row, call);
      return;
    }
  }
  ah__call_reply(call, json_pack("{s:b}", "cancelled", cancelled));
}

static void cancel_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const json_t *row = found_row(call, results, 0);
  if (row)
    cancel(call, m, p, row);
}

static void m_cancel(ah_call *call, const json_t *p, void *data) {
  if (store_ready(call, data) && session_param(call, p))
    cancel(call, SM(data), p, NULL);
}

static void close_found(int status, session *s, void *arg) {
  ah_call *call = arg;
  if (status == AH_ECLOSED) {
    ah__call_reply(call, json_object()); /* closing a closed session is a no-op */
    return;
  }
  if (status) {
    ah__call_error(call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    return;
  }
  ah__live_close(s, call);
}

static void m_close(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = str(p, "sessionId");
  if (!id) {
    ah__call_error(call, AH_EINVAL, "params.sessionId is required", NULL);
    return;
  }
  /* A cold session is resumed (lease) to be closed, so two processes never close and run it at once. */
  ah__live_lookup_to_close(SM(data), id, close_found, call);
}

typedef struct delete_ctx {
  ah_sessions *m;
  ah_call *call;
  char *id;
} delete_ctx;

/* The rows are gone: session.deleted tells every surface (a list shown in a tab drops it). */
static void delete_written(int status, const json_t *results, void *arg) {
  (void)results;
  delete_ctx *c = arg;
  if (status) {
    ah__call_error(c->call, status, "the session could not be deleted", NULL);
  } else {
    ah__call_reply(c->call, json_object());
    ah__sm_emit(c->m, "session.deleted", json_pack("{s:s}", "sessionId", c->id));
  }
  free(c->id);
  free(c);
}

static void delete_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const char *id = str(p, "sessionId");
  const json_t *row = found_row(call, results, 0);
  if (!row)
    return;
  bool closed = json_is_true(json_object_get(row, "closed"));
  if (!closed || ah__live_find(m, id)) {
    ah__call_error(call, AH_EBUSY, "close the session before deleting it", NULL);
    return;
  }
  delete_ctx *c = calloc(1, sizeof *c);
  if (!c || !(c->id = strdup(id))) {
    free(c);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->m = m;
  c->call = call;
  int rc = ah__store_write(ah__sm_store(m), json_pack("[{s:s, s:s}]", "op", "session.delete", "id", id),
                           delete_written, c);
  if (rc) {
    ah__call_error(call, rc, ah_strerror(rc), NULL);
    free(c->id);
    free(c);
  }
}

static void m_delete(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = session_param(call, p);
  if (id)
    method_read(call, SM(data), p, &(ah_store_query){.kind = AH_STORE_Q_SESSION, .id = id}, 1, delete_read);
}

typedef struct policy_ctx {
  ah_call *call;
  json_t *policy;
} policy_ctx;

static void policy_found(int status, session *s, void *arg) {
  policy_ctx *c = arg;
  ah_call *call = c->call;
  json_t *p = c->policy;
  free(c);
  if (status) {
    ah__call_error(call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    json_decref(p);
    return;
  }
  json_t *policy = json_deep_copy(json_object_get(s->row, "policy"));
  if (!json_is_object(policy)) {
    json_decref(policy);
    policy = json_object();
  }
  json_object_update(policy, p);
  json_decref(p);
  ah__write_fields(s, json_pack("{s:O}", "policy", policy));
  ah__call_reply(call, json_pack("{s:o}", "policy", policy));
}

static void m_set_policy(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = str(p, "sessionId");
  json_t *policy = json_object_get(p, "policy");
  const char *k = NULL;
  json_t *v = NULL;
  bool ok = id && json_is_object(policy);
  json_object_foreach(policy, k, v) {
    const char *val = json_string_value(v);
    ok = ok && ah__tool_exists(SM(data)->host, k) && val &&
         (strcmp(val, "allow") == 0 || strcmp(val, "ask") == 0 || strcmp(val, "deny") == 0);
  }
  if (!ok) {
    ah__call_error(call, AH_EINVAL, "params: sessionId and policy {TOOL: allow|ask|deny} for known tools",
                   NULL);
    return;
  }
  policy_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  c->policy = json_deep_copy(policy);
  ah__live_lookup(SM(data), id, policy_found, c);
}

/* session.options {sessionId} → {options}: the session's selectors (docs/sessions.md "Options"), from its
 * row — a stored session is not loaded for it. */
static void options_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  (void)p;
  const json_t *row = found_row(call, results, 0);
  if (!row)
    return;
  json_t *shown = live_status_row(m, row, json_array_get(results, 1));
  ah__call_reply(call, json_pack("{s:o}", "options", ah__session_options_of(m, shown)));
  json_decref(shown);
}

static void m_options(ah_call *call, const json_t *p, void *data) {
  if (store_ready(call, data))
    read_shown(call, SM(data), p, options_read);
}

/* session.set-option {sessionId, configId, value} → {options}: every option after the change. */
typedef struct option_ctx {
  ah_call *call;
  char *id;
  json_t *value;
} option_ctx;

static void option_found(int status, session *s, void *arg) {
  option_ctx *c = arg;
  char why[200] = "";
  if (!status)
    status = ah__session_set_option(s, c->id, c->value, false, why, sizeof why);
  else
    snprintf(why, sizeof why, "%s", status == AH_ENOENT ? "no such session" : ah_strerror(status));
  if (status)
    ah__call_error(c->call, status, why, NULL);
  else
    ah__call_reply(c->call, json_pack("{s:o}", "options", ah__session_options(s)));
  free(c->id);
  json_decref(c->value);
  free(c);
}

static void m_set_option(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = str(p, "sessionId");
  const char *option = str(p, "configId");
  if (!id || !option || !json_is_string(json_object_get(p, "value"))) {
    ah__call_error(call, AH_EINVAL, "params: sessionId, configId and value (strings) are required", NULL);
    return;
  }
  option_ctx *c = calloc(1, sizeof *c);
  if (!c || !(c->id = strdup(option))) {
    free(c);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  c->value = json_incref(json_object_get(p, "value"));
  ah__live_lookup(SM(data), id, option_found, c);
}

/* session.set-editor {sessionId, read?, write?, run?} → {}: the methods (of the caller's surface) through
 * which the session's read_file, write_file and run_command reach the client's editor — its unsaved
 * buffers, its edits, its terminal (docs/sessions.md "session.set-editor"); all absent: the host's own
 * again. Live only: a surface sets it when it attaches the session (a method that no longer exists fails
 * the tool). */
typedef struct editor_ctx {
  ah_call *call;
  char *names[3]; /* read, write, run */
} editor_ctx;

static void editor_ctx_free(editor_ctx *c) {
  for (int i = 0; c && i < 3; i++)
    free(c->names[i]);
  free(c);
}

static void editor_found(int status, session *s, void *arg) {
  editor_ctx *c = arg;
  if (status) {
    ah__call_error(c->call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    editor_ctx_free(c);
    return;
  }
  char **slots[3] = {&s->editor.read, &s->editor.write, &s->editor.run};
  for (int i = 0; i < 3; i++) {
    free(*slots[i]);
    *slots[i] = c->names[i];
    c->names[i] = NULL;
  }
  ah__call_reply(c->call, json_object());
  editor_ctx_free(c);
}

static void m_set_editor(ah_call *call, const json_t *p, void *data) {
  static const char *const keys[3] = {"read", "write", "run"};
  const char *id = str(p, "sessionId");
  editor_ctx *c = calloc(1, sizeof *c);
  bool ok = id != NULL, nomem = !c;
  for (int i = 0; c && i < 3; i++) {
    json_t *v = json_object_get(p, keys[i]);
    ok &= !v || json_is_string(v) || json_is_null(v);
    if (json_is_string(v) && !(c->names[i] = strdup(json_string_value(v))))
      nomem = true;
  }
  if (!ok || nomem) {
    editor_ctx_free(c);
    ah__call_error(
        call, nomem ? AH_ENOMEM : AH_EINVAL,
        nomem ? "out of memory" : "params: sessionId, and read / write / run method names (or null)", NULL);
    return;
  }
  c->call = call;
  ah__live_lookup(SM(data), id, editor_found, c);
}

/* session.follow {sessionId} → {sessionId, closed: true}, answered only when the follow ends: a surface that
 * follows a session (an editor connection that has it, a browser tab that shows it) keeps it in memory while
 * the call runs — it is not unloaded when idle ([host] idle_unload_s). The follow ends when the call is
 * cancelled (its token, or the caller's connection, ends: answered `cancelled`), when the session is closed
 * (the answer above) or when it stops running here (an error). */
static void follow_found(int status, session *s, void *arg) {
  ah_call *call = arg;
  if (status) {
    ah__call_error(call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    return;
  }
  int rc = ah__live_follow(s, call);
  if (rc)
    ah__call_error(call, rc, ah_strerror(rc), NULL);
}

static void follow_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const json_t *row = json_array_get(results, 0);
  const char *holder = str(row, "leaseOwner");
  if (holder && strcmp(holder, m->owner) != 0 && !ah__hosts_runs_here(m, str(p, "sessionId")))
    ah__call_error(call, AH_EAGENTBUSY, "the session runs on another host", NULL);
  else
    ah__live_lookup(m, str(p, "sessionId"), follow_found, call);
}

static void m_follow(ah_call *call, const json_t *p, void *data) {
  const char *id = str(p, "sessionId");
  if (!id) {
    ah__call_error(call, AH_EINVAL, "params: sessionId is required", NULL);
    return;
  }
  ah_sessions *m = SM(data);
  /* A shared store: a session another host holds is followed by its events (hosts.c); a follow does not
   * try to take its lease (a surface asks again at each call about the session: a write each time). */
  if (ah__hosts_active(m) && !ah__hosts_runs_here(m, id))
    method_read(call, m, p, &(ah_store_query){.kind = AH_STORE_Q_SESSION, .id = id}, 1, follow_read);
  else
    ah__live_lookup(m, id, follow_found, call);
}

/* session.tools {sessionId} → {tools: [{name, description, schema, group?, policy}], notices: [string]}: what
 * the session's next turn would offer, each with the policy that applies to it (the tool sources are asked
 * as at a turn's start: host-wide MCP servers start at this first use). */
typedef struct tools_ctx {
  ah_call *call;
  json_t *policy; /* the session's own */
} tools_ctx;

static void tools_listed(const json_t *tools, const json_t *notices, void *arg) {
  tools_ctx *c = arg;
  ah_host *h = c->call->host;
  json_t *out = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *copy = json_deep_copy(t);
    const char *name = str(t, "name");
    const char *own = str(c->policy, name);
    const char *dflt = ah__tool_policy(h, name);
    json_object_set_new(copy, "policy", json_string(own ? own : dflt ? dflt : "ask"));
    json_array_append_new(out, copy);
  }
  ah__call_reply(c->call, json_pack("{s:o, s:O}", "tools", out, "notices", notices));
  json_decref(c->policy);
  free(c);
}

static void tools_found(int status, session *s, void *arg) {
  tools_ctx *c = arg;
  if (status) {
    ah__call_error(c->call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    free(c);
    return;
  }
  c->policy = json_deep_copy(json_object_get(s->row, "policy"));
  int rc = ah__tools_gather(s->m->host, s->id, str(s->row, "cwd"), ah__call_cancel_token(c->call),
                            tools_listed, c);
  if (rc) {
    ah__call_error(c->call, rc, ah_strerror(rc), NULL);
    json_decref(c->policy);
    free(c);
  }
}

static void m_tools(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = str(p, "sessionId");
  tools_ctx *c = id ? calloc(1, sizeof *c) : NULL;
  if (!c) {
    ah__call_error(call, id ? AH_ENOMEM : AH_EINVAL, id ? "out of memory" : "params: sessionId is required",
                   NULL);
    return;
  }
  c->call = call;
  ah__live_lookup(SM(data), id, tools_found, c);
}

static void requests_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  json_t *out = json_deep_copy(json_object_get(p, "requests"));
  json_t *elsewhere = ah__hosts_requests(m, json_array_get(results, 0));
  json_array_extend(out, elsewhere);
  json_decref(elsewhere);
  ah__call_reply(call, json_pack("{s:o}", "requests", out));
}

static void m_request_list(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *sid = str(p, "sessionId");
  json_t *out = json_array();
  AH__LIST_EACH(it, &m->requests) {
    request *r = AH__CONTAINER(it, request, link);
    if (!sid || strcmp(sid, r->session_id) == 0)
      json_array_append_new(out, ah__request_json(r));
  }
  if (ah__hosts_active(m)) { /* and those of sessions other hosts run */
    json_t *rp = json_pack("{s:o}", "requests", out);
    method_read(call, m, rp, &(ah_store_query){.kind = AH_STORE_Q_REQUESTS_PENDING, .id = sid}, 1,
                requests_read);
    json_decref(rp);
    return;
  }
  ah__call_reply(call, json_pack("{s:o}", "requests", out));
}

/* What an answer (`value`, or an error response when NULL) to a request of `kind` with `options` resolves it
 * to: its state, its stored answer (a new reference or NULL) and the option chosen (borrowed from value).
 * NULL, or the reason the value is refused. */
static const char *answer_of(const char *kind, const json_t *options, const json_t *value, const char **state,
                             json_t **answer, const char **opt) {
  *answer = NULL;
  *opt = NULL;
  if (kind && strcmp(kind, "approval") == 0) {
    *opt = value ? str(value, "optionId") : NULL;
    if (value && (!*opt || !ah__request_is_option(options, *opt)))
      return "value.optionId: must be one of the request's options";
    *state = *opt && strncmp(*opt, "allow", 5) == 0 ? "granted" : "denied";
    *answer = *opt ? json_pack("{s:s}", "optionId", *opt) : NULL;
    return NULL;
  }
  json_t *ans = value ? json_object_get(value, "answer") : NULL;
  if (value && !json_is_string(ans))
    return "value.answer: a string is required";
  *state = ans ? "answered" : "cancelled";
  *answer = ans ? json_pack("{s:O}", "answer", ans) : NULL;
  return NULL;
}

/* An answer for a request pending here. */
static void answer_here(ah_call *call, request *r, const json_t *value) {
  const char *state = NULL, *opt = NULL;
  json_t *answer = NULL;
  const char *why = answer_of(r->kind, r->options, value, &state, &answer, &opt);
  if (why) {
    ah__call_error(call, AH_EINVAL, why, NULL);
    return;
  }
  ah__request_answer(r, state, answer, opt, call);
  json_decref(answer);
}

/* Late or duplicate: a receipt, never a second resolution. `row`: the request's stored row, or NULL. */
static void answer_late(ah_call *call, ah_sessions *m, const char *id, const json_t *row) {
  const ah_caller *by = ah__call_caller(call);
  json_t *seen = json_object_get(m->resolved, id);
  const char *reason = row ? "resolved" : "unknown";
  if (seen) {
    char who[96];
    snprintf(who, sizeof who, "%s:%llu", by->surface ? by->surface : "",
             (unsigned long long)by->connection_id);
    reason = strcmp(str(seen, "by"), who) == 0 ? "duplicate" : "resolved";
  }
  ah__call_reply(call, json_pack("{s:b, s:s}", "accepted", 0, "reason", reason));
}

/* The request's stored row was read: pending for a session another host runs, the answer is checked as
 * here, then posted (the request's row takes it; the owner acts on it); else it is late or duplicate. */
static void respond_read(ah_call *call, ah_sessions *m, const json_t *p, const json_t *results) {
  const char *id = str(p, "id");
  const json_t *value = json_object_get(p, "value");
  request *r = ah__request_find(m, id); /* made here while the row was read */
  if (r) {
    answer_here(call, r, value);
    return;
  }
  const json_t *row = json_array_get(results, 0);
  row = json_is_object(row) ? row : NULL;
  const char *pending = row ? str(row, "state") : NULL;
  const char *sid = row ? str(row, "sessionId") : NULL;
  if (!ah__hosts_active(m) || !pending || strcmp(pending, "pending") != 0 || !sid ||
      ah__hosts_runs_here(m, sid)) {
    answer_late(call, m, id, row);
    return;
  }
  const char *state = NULL, *opt = NULL;
  json_t *answer = NULL;
  const char *why =
      answer_of(str(row, "kind"), json_object_get(row, "options"), value, &state, &answer, &opt);
  if (why)
    ah__call_error(call, AH_EINVAL, why, NULL);
  else
    ah__hosts_answer(m, row, state, answer, call);
}

static void m_request_respond(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *id = str(p, "id");
  json_t *value = json_object_get(p, "value");
  json_t *error = json_object_get(p, "error");
  if (!id || (value != NULL) == (error != NULL)) {
    ah__call_error(call, AH_EINVAL, "params: id and exactly one of value or error are required", NULL);
    return;
  }
  request *r = ah__request_find(m, id);
  if (r)
    answer_here(call, r, value);
  else if (!ah__hosts_active(m) && json_object_get(m->resolved, id))
    answer_late(call, m, id, NULL);
  else /* pending elsewhere, or whether it was ever made */
    method_read(call, m, p, &(ah_store_query){.kind = AH_STORE_Q_REQUEST, .id = id}, 1, respond_read);
}

/* provider.list {} → {providers: [{name, type, model?, models, default, available, key?, keyEnv?,
 * keyReady?}]}: the configured
 * providers (and the built-in echo), without a secret: only these keys are read from their sections. */
static void m_provider_list(ah_call *call, const json_t *p, void *data) {
  (void)p;
  ah_sessions *m = SM(data);
  const ah_config *cfg = ah__host_config(m->host);
  const char *def = cfg && cfg->default_provider ? cfg->default_provider : "echo";
  json_t *list = json_array();
  bool echo_listed = false;
  const char *name = NULL;
  json_t *pc = NULL;
  json_object_foreach(cfg ? cfg->providers : NULL, name, pc) {
    json_t *models = ah__config_list(str(pc, "models"));
    if (!models)
      models = json_array();
    const char *model = str(pc, "model");
    if (model && json_array_size(models) == 0)
      json_array_append_new(models, json_string(model));
    json_t *entry = json_pack("{s:s, s:s*, s:s*, s:o, s:b, s:b}", "name", name, "type", str(pc, "type"),
                              "model", model, "models", models, "default", strcmp(name, def) == 0,
                              "available", ah__turn_provider(m, name, NULL, NULL) != NULL);
    /* Where its API key comes from and whether it is there now (never the key). */
    const char *env = str(pc, "api_key_env");
    const char *file = str(pc, "api_key_file");
    if (entry && (env || file)) {
      const char *v = env ? getenv(env) : NULL;
      json_object_set_new(entry, "key", json_string(env ? "env" : "file"));
      if (env)
        json_object_set_new(entry, "keyEnv", json_string(env));
      json_object_set_new(entry, "keyReady", json_boolean(env ? v && *v : access(file, R_OK) == 0));
    }
    json_array_append_new(list, entry);
    echo_listed |= strcmp(name, "echo") == 0;
  }
  if (!echo_listed)
    json_array_insert_new(list, 0,
                          json_pack("{s:s, s:s, s:[], s:b, s:b}", "name", "echo", "type", "echo", "models",
                                    "default", strcmp(def, "echo") == 0, "available", 1));
  ah__call_reply(call, json_pack("{s:o}", "providers", list));
}

typedef struct models_ctx {
  ah_call *call;
} models_ctx;

static void models_done(void *arg, int status, const json_t *models, const char *message) {
  models_ctx *c = arg;
  if (status)
    ah__call_error(c->call, status, message ? message : ah_strerror(status), NULL);
  else
    ah__call_reply(c->call, json_pack("{s:O}", "models", models ? models : json_array()));
  free(c);
}

/* provider.models {provider} → {models: [{id, ownedBy?}]} (privileged: it makes the provider's server
 * answer with the configured key): what the provider's server offers (openai: GET {base_url}/models). */
static void m_provider_models(ah_call *call, const json_t *p, void *data) {
  ah_sessions *m = SM(data);
  const char *name = str(p, "provider");
  if (!name) {
    ah__call_error(call, AH_EINVAL, "params.provider: the name of a configured provider is required", NULL);
    return;
  }
  const json_t *config = NULL;
  ah_provider *prov = ah__turn_provider(m, name, NULL, &config);
  if (!prov) {
    ah__call_error(call, AH_ENOENT, "params.provider: no such provider is available", NULL);
    return;
  }
  if (!AH_HAS(prov, ah_provider, list_models)) {
    ah__call_error(call, AH_EUNAVAILABLE, "this provider cannot list models", NULL);
    return;
  }
  models_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  json_t *empty = json_object();
  int rc = prov->list_models(prov, name, config ? config : empty, models_done, c);
  json_decref(empty);
  if (rc) {
    free(c);
    ah__call_error(call, rc, ah_strerror(rc), NULL);
  }
}

/* ---- registration, start, stop
 * --------------------------------------------------------------------------------- */

int ah__sessions_register(ah_sessions *m, ah_mount *core) {
  const struct {
    const char *name;
    ah_method_fn fn;
    uint32_t flags;
  } methods[] = {
      {"session.create", m_create, AH_METHOD_PUBLIC},
      {"session.list", m_list, AH_METHOD_PUBLIC},
      {"session.get", m_get, AH_METHOD_PUBLIC},
      {"session.history", m_history, AH_METHOD_PUBLIC},
      {"session.prompt", m_prompt, AH_METHOD_PUBLIC},
      {"session.cancel", m_cancel, AH_METHOD_PUBLIC},
      {"session.close", m_close, AH_METHOD_PUBLIC},
      {"session.export", m_export, AH_METHOD_PUBLIC},
      {"session.tools", m_tools, AH_METHOD_PUBLIC | AH_METHOD_CANCELLABLE},
      {"session.delete", m_delete, AH_METHOD_PRIVILEGED},
      {"session.set-policy", m_set_policy, AH_METHOD_PRIVILEGED},
      {"session.options", m_options, AH_METHOD_PUBLIC},
      {"session.set-option", m_set_option, AH_METHOD_PRIVILEGED},
      {"session.set-editor", m_set_editor, AH_METHOD_PRIVILEGED},
      {"session.follow", m_follow, AH_METHOD_PRIVILEGED | AH_METHOD_CANCELLABLE},
      {"request.list", m_request_list, AH_METHOD_PUBLIC},
      {"request.respond", m_request_respond, AH_METHOD_PUBLIC},
      {"provider.list", m_provider_list, AH_METHOD_PUBLIC},
      {"provider.models", m_provider_models, AH_METHOD_PRIVILEGED},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    ah_method_def def = {.struct_size = sizeof def,
                         .name = methods[i].name,
                         .handler = methods[i].fn,
                         .flags = methods[i].flags,
                         .data = m};
    int rc = ah__services_register_method(core, &def);
    if (rc)
      return rc;
  }
  /* Transient deltas, reasoning and tools' progress are for clients that stream text; not on the remote
   * allowlist (DECISIONS.md). */
  int rc = ah__services_register_event(core, "session.delta", 0);
  rc = rc ? rc : ah__services_register_event(core, "session.progress", 0);
  return rc ? rc : ah__services_register_event(core, "session.reasoning", 0);
}
