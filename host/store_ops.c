/* See store_ops.h. */
#include "store_ops.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const ah_store_update_col update_cols[] = {
    {"cwd", "cwd", AH_COL_TEXT},           {"title", "title", AH_COL_TEXT},
    {"provider", "provider", AH_COL_TEXT}, {"model", "model", AH_COL_TEXT},
    {"parent", "parent", AH_COL_TEXT},     {"local", "\"local\"", AH_COL_BOOL},
    {"depth", "depth", AH_COL_INT},        {"status", "status", AH_COL_TEXT},
    {"closed", "closed", AH_COL_BOOL},     {"created", "created", AH_COL_VALUE},
    {"updated", "updated", AH_COL_VALUE},  {"policy", "policy", AH_COL_JSON},
    {"tags", "tags", AH_COL_JSON},         {"settings", "settings", AH_COL_JSON},
    {"usage", "\"usage\"", AH_COL_JSON},
};

const ah_store_update_col *ah__store_update_col(const char *key) {
  for (size_t k = 0; key && k < sizeof update_cols / sizeof update_cols[0]; k++)
    if (strcmp(update_cols[k].key, key) == 0)
      return &update_cols[k];
  return NULL;
}

static const char *str(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

static bool one_of(const char *s, const char *const *set) {
  for (; s && *set; set++)
    if (strcmp(s, *set) == 0)
      return true;
  return false;
}

static bool str_or_null(const json_t *v) {
  return !v || json_is_string(v) || json_is_null(v);
}

static bool scalar(const json_t *v) {
  return !v || (!json_is_object(v) && !json_is_array(v));
}

static ah_store_op refuse(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ah_store_op refuse(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return AH_OP_INVALID;
}

static ah_store_op check_update(const json_t *op, char *err, size_t cap) {
  const json_t *set = json_object_get(op, "set");
  if (!str(op, "id") || !json_is_object(set))
    return refuse(err, cap, "session.update needs a string id and a set object");
  const char *key = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)set, key, v) {
    const ah_store_update_col *c = ah__store_update_col(key);
    if (!c)
      return refuse(err, cap, "session.update: field \"%s\" cannot be set", key);
    bool ok = c->kind == AH_COL_TEXT    ? json_is_string(v) || json_is_null(v)
              : c->kind == AH_COL_BOOL  ? json_is_boolean(v)
              : c->kind == AH_COL_INT   ? json_is_integer(v)
              : c->kind == AH_COL_VALUE ? scalar(v)
                                        : !json_is_null(v);
    if (!ok)
      return refuse(err, cap, "session.update: field \"%s\" has the wrong type", key);
  }
  return AH_OP_SESSION_UPDATE;
}

ah_store_op ah__store_op_check(const json_t *op, char *err, size_t cap) {
  const char *name = str(op, "op");
  if (!name)
    return refuse(err, cap, "unknown operation (no \"op\" string)");
  if (strcmp(name, "session.put") == 0) {
    const json_t *s = json_object_get(op, "session");
    const char *id = str(s, "id");
    if (!json_is_object(s) || !id || !*id)
      return refuse(err, cap, "session.put needs a session object with a string id");
    const json_t *last_seq = json_object_get(s, "lastSeq");
    const json_t *lease_until = json_object_get(s, "leaseUntil");
    if ((last_seq && !json_is_integer(last_seq)) || (lease_until && !json_is_integer(lease_until)))
      return refuse(err, cap, "session.put: lastSeq and leaseUntil must be integers");
    return AH_OP_SESSION_PUT;
  }
  if (strcmp(name, "session.update") == 0)
    return check_update(op, err, cap);
  if (strcmp(name, "session.delete") == 0)
    return str(op, "id") ? AH_OP_SESSION_DELETE : refuse(err, cap, "session.delete needs a string id");
  if (strcmp(name, "event") == 0) {
    if (!str(op, "sessionId") || !str(op, "kind") || !json_is_integer(json_object_get(op, "seq")) ||
        !str_or_null(json_object_get(op, "turnId")) || !str_or_null(json_object_get(op, "messageId")) ||
        !scalar(json_object_get(op, "time")))
      return refuse(err, cap,
                    "event needs sessionId, kind (strings), seq (integer); turnId/messageId must be strings");
    return AH_OP_EVENT;
  }
  if (strcmp(name, "inbox.put") == 0) {
    static const char *const states[] = {"queued", "posted", NULL};
    const json_t *content = json_object_get(op, "content");
    const json_t *state = json_object_get(op, "state");
    if (!str(op, "messageId") || !str(op, "sessionId") || !content || json_is_null(content) ||
        (state && !one_of(json_string_value(state), states)))
      return refuse(err, cap,
                    "inbox.put needs messageId, sessionId (strings) and content; state is queued or posted");
    return AH_OP_INBOX_PUT;
  }
  if (strcmp(name, "inbox.state") == 0) {
    static const char *const states[] = {"queued", "claimed", "done", "cancelled", NULL};
    if (!str(op, "messageId") || !one_of(str(op, "state"), states) ||
        !str_or_null(json_object_get(op, "turnId")))
      return refuse(err, cap,
                    "inbox.state needs messageId and a state of queued, claimed, done or cancelled");
    return AH_OP_INBOX_STATE;
  }
  if (strcmp(name, "request.put") == 0) {
    const json_t *r = json_object_get(op, "request");
    const json_t *state = json_object_get(r, "state");
    if (!str(r, "id") || !str(r, "sessionId") || !str(r, "kind") ||
        !str_or_null(json_object_get(r, "turnId")) || (state && !json_is_string(state)))
      return refuse(err, cap, "request.put needs a request with id, sessionId and kind (strings)");
    return AH_OP_REQUEST_PUT;
  }
  if (strcmp(name, "request.state") == 0) {
    static const char *const states[] = {"granted", "denied", "answered", "cancelled", NULL};
    if (!str(op, "id") || !one_of(str(op, "state"), states))
      return refuse(err, cap, "request.state needs id and a state of granted, denied, answered or cancelled");
    return AH_OP_REQUEST_STATE;
  }
  if (strcmp(name, "lease") == 0) {
    if (!str(op, "id") || !str(op, "owner") || !json_is_integer(json_object_get(op, "until")) ||
        !json_is_integer(json_object_get(op, "now")) || !str_or_null(json_object_get(op, "steal")))
      return refuse(err, cap,
                    "lease needs id, owner (strings), until and now (integers); steal must be a string");
    return AH_OP_LEASE;
  }
  if (strcmp(name, "lease.renew") == 0) {
    if (!str(op, "owner") || !json_is_integer(json_object_get(op, "until")) ||
        !json_is_integer(json_object_get(op, "now")))
      return refuse(err, cap, "lease.renew needs owner (a string), until and now (integers)");
    return AH_OP_LEASE_RENEW;
  }
  if (strcmp(name, "lease.end") == 0)
    return str(op, "owner") ? AH_OP_LEASE_END : refuse(err, cap, "lease.end needs owner (a string)");
  if (strcmp(name, "lease.release") == 0)
    return str(op, "id") && str(op, "owner") ? AH_OP_LEASE_RELEASE
                                             : refuse(err, cap, "lease.release needs id and owner (strings)");
  if (strcmp(name, "fence") == 0)
    return str(op, "id") && str(op, "owner") ? AH_OP_FENCE
                                             : refuse(err, cap, "fence needs id and owner (strings)");
  if (strcmp(name, "notify") == 0) {
    const char *payload = str(op, "payload");
    if (!payload || strlen(payload) > 7000)
      return refuse(err, cap, "notify needs a payload (a string of at most 7000 bytes)");
    return AH_OP_NOTIFY;
  }
  if (strcmp(name, "store.shrink") == 0)
    return AH_OP_STORE_SHRINK;
  return refuse(err, cap, "unknown operation %s", name);
}
