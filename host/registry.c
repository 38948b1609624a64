/* The registry: methods, events, remote descriptors and remote namespaces, each owned by a mount.
 *
 * Entries are staged in the mount's journal while mount() runs and are already in the table then, so a
 * duplicate is refused against live and staged entries alike; publishing flips them to ACTIVE in one
 * step (nothing else runs on the loop meanwhile). A withdrawn name leaves a tombstone so it fails closed
 * (`unavailable`) until a new mount registers it; it never falls back to another entry.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static size_t hash_str(const char *s, ah__entry_kind kind) {
  size_t h = 1469598103934665603ull ^ (size_t)kind;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

int ah__registry_init(ah__registry *r) {
  r->nbuckets = 256;
  r->buckets = calloc(r->nbuckets, sizeof *r->buckets);
  r->tombstones = json_object();
  return r->buckets && r->tombstones ? 0 : AH_ENOMEM;
}

void ah__registry_free(ah__registry *r) {
  free(r->buckets);
  r->buckets = NULL;
  json_decref(r->tombstones);
  r->tombstones = NULL;
}

ah_provider *ah__registry_provider(ah__registry *r, const char *type, ah_mount **mount) {
  ah__entry *e = ah__registry_find(r, AH__ENTRY_PROVIDER, type);
  if (!e || e->state != AH__ST_ACTIVE || !e->mount || e->mount->state != AH__MOUNT_ACTIVE)
    return NULL;
  if (mount)
    *mount = e->mount;
  return e->data;
}

static int by_name(const void *a, const void *b) {
  const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
  return strcmp(json_string_value(json_object_get(x, "name")), json_string_value(json_object_get(y, "name")));
}

json_t *ah__registry_tools(ah__registry *r) {
  json_t *list = json_array();
  for (size_t i = 0; list && i < r->nbuckets; i++)
    for (ah__entry *e = r->buckets[i]; e; e = e->hash_next)
      if (e->kind == AH__ENTRY_TOOL && e->state == AH__ST_ACTIVE && e->mount &&
          e->mount->state == AH__MOUNT_ACTIVE)
        json_array_append_new(list, json_pack("{s:s, s:O, s:O}", "name", e->name, "description",
                                              json_object_get(e->meta, "description"), "schema",
                                              json_object_get(e->meta, "schema")));
  size_t n = json_array_size(list);
  if (n > 1) {
    json_t **items = malloc(n * sizeof *items);
    if (items) {
      for (size_t i = 0; i < n; i++)
        items[i] = json_incref(json_array_get(list, i));
      qsort(items, n, sizeof *items, by_name);
      json_array_clear(list);
      for (size_t i = 0; i < n; i++)
        json_array_append_new(list, items[i]);
      free(items);
    }
  }
  return list;
}

bool ah__registry_tool_under(ah__registry *r, const char *prefix) {
  size_t n = strlen(prefix);
  for (size_t i = 0; i < r->nbuckets; i++)
    for (ah__entry *e = r->buckets[i]; e; e = e->hash_next)
      if (e->kind == AH__ENTRY_TOOL && (e->state == AH__ST_ACTIVE || e->state == AH__ST_STAGED) &&
          strncmp(e->name, prefix, n) == 0)
        return true;
  return false;
}

ah__entry *ah__registry_find(ah__registry *r, ah__entry_kind kind, const char *name) {
  if (!name)
    return NULL;
  for (ah__entry *e = r->buckets[hash_str(name, kind) % r->nbuckets]; e; e = e->hash_next)
    if (e->kind == kind && strcmp(e->name, name) == 0)
      return e;
  return NULL;
}

static char *tomb_key(ah__entry_kind kind, const char *name) {
  char *k = NULL;
  if (asprintf(&k, "%d:%s", (int)kind, name) < 0)
    return NULL;
  return k;
}

bool ah__registry_tombstoned(ah__registry *r, ah__entry_kind kind, const char *name) {
  char *k = tomb_key(kind, name);
  bool t = k && json_object_get(r->tombstones, k) != NULL;
  free(k);
  return t;
}

static void table_unlink(ah__registry *r, ah__entry *e) {
  ah__entry **pp = &r->buckets[hash_str(e->name, e->kind) % r->nbuckets];
  while (*pp && *pp != e)
    pp = &(*pp)->hash_next;
  if (*pp)
    *pp = e->hash_next;
  e->hash_next = NULL;
}

int ah__registry_stage(ah__registry *r, ah_mount *m, ah__entry *e) {
  ah__entry *old = ah__registry_find(r, e->kind, e->name);
  if (old)
    return AH_EEXIST;
  size_t b = hash_str(e->name, e->kind) % r->nbuckets;
  e->hash_next = r->buckets[b];
  r->buckets[b] = e;
  e->mount = m;
  e->state = AH__ST_STAGED;
  ah__list_push(&m->journal, &e->journal);
  return 0;
}

void ah__registry_publish(ah__registry *r, ah_mount *m) {
  r->gen++;
  AH__LIST_EACH(it, &m->journal) {
    ah__entry *e = AH__CONTAINER(it, ah__entry, journal);
    e->state = AH__ST_ACTIVE;
    char *k = tomb_key(e->kind, e->name);
    if (k)
      json_object_del(r->tombstones, k);
    free(k);
  }
}

void ah__registry_withdraw(ah__registry *r, ah_mount *m) {
  r->gen++;
  AH__LIST_EACH(it, &m->journal) {
    AH__CONTAINER(it, ah__entry, journal)->state = AH__ST_WITHDRAWN;
  }
}

void ah__registry_remove(ah__registry *r, ah_mount *m, bool tombstone) {
  r->gen++;
  while (!ah__list_empty(&m->journal)) {
    ah__link *l = m->journal.prev; /* reverse registration order */
    ah__entry *e = AH__CONTAINER(l, ah__entry, journal);
    ah__list_remove(l);
    table_unlink(r, e);
    if (tombstone && (e->kind == AH__ENTRY_METHOD || e->kind == AH__ENTRY_REMOTE)) {
      char *k = tomb_key(e->kind, e->name);
      if (k)
        json_object_set_new(r->tombstones, k, json_true());
      free(k);
    }
    ah__entry_free(e);
  }
}

void ah__entry_free(ah__entry *e) {
  if (!e)
    return;
  ah__remote_free(e->remote);
  json_decref(e->meta);
  free(e->name);
  free(e);
}

/* ---- names ---------------------------------------------------------------------------------------- */

static bool seg_char(char c, bool first) {
  if (first)
    return c >= 'a' && c <= 'z';
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Dot-separated segments of [a-z][a-z0-9_-]*, at least `min_segments`, at most 128 bytes. */
static bool dotted_name(const char *s, int min_segments) {
  if (!s || !*s || strlen(s) > 128)
    return false;
  int segments = 1;
  bool first = true;
  for (const char *p = s; *p; p++) {
    if (*p == '.') {
      if (first)
        return false; /* empty segment */
      segments++;
      first = true;
      continue;
    }
    if (!seg_char(*p, first))
      return false;
    first = false;
  }
  return !first && segments >= min_segments;
}

bool ah__valid_method_name(const char *s) {
  return dotted_name(s, 2);
}
bool ah__valid_event_name(const char *s) {
  return dotted_name(s, 2);
}

/* [a-z][a-z0-9-]{0,31}: the same rule as a [plugin.NAME] section, so every plugin can be configured. */
bool ah__valid_plugin_name(const char *s) {
  if (!s || !*s || strlen(s) > 32)
    return false;
  for (const char *p = s; *p; p++)
    if (*p == '_' || !seg_char(*p, p == s))
      return false;
  return true;
}

/* A namespace is [a-z][a-z0-9_-]* (no capitals); a method or parameter name is [a-z][A-Za-z0-9_]*. */
static bool ident(const char *s, bool is_namespace) {
  if (!s || !*s || strlen(s) > 64 || !(s[0] >= 'a' && s[0] <= 'z'))
    return false;
  for (const char *p = s + 1; *p; p++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
              (is_namespace ? c == '-' : (c >= 'A' && c <= 'Z'));
    if (!ok)
      return false;
  }
  return true;
}

/* ---- remote descriptors --------------------------------------------------------------------------- */

const char *ah__type_name(ah_type t) {
  switch (t) {
  case AH_TYPE_VOID:
    return "void";
  case AH_TYPE_BOOL:
    return "bool";
  case AH_TYPE_INT64:
    return "int64";
  case AH_TYPE_DOUBLE:
    return "double";
  case AH_TYPE_STRING:
    return "string";
  case AH_TYPE_JSON:
    return "json";
  case AH_TYPE_SESSION:
    return "session";
  case AH_TYPE_AGENT:
    return "agent";
  default:
    return "invalid";
  }
}

static ffi_type *param_ffi(ah_type t, bool optional) {
  if (optional)
    return &ffi_type_pointer;
  switch (t) {
  case AH_TYPE_BOOL:
    return &ffi_type_uint8;
  case AH_TYPE_INT64:
    return &ffi_type_sint64;
  case AH_TYPE_DOUBLE:
    return &ffi_type_double;
  default:
    return &ffi_type_pointer;
  }
}

void ah__remote_free(ah__remote *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->nparams; i++)
    free((char *)r->params[i].name);
  free(r->params);
  free(r->arg_types);
  free(r->ns);
  free(r->method);
  free(r);
}

#define REFUSE(field, ...)                                                           \
  do {                                                                               \
    char why_[256];                                                                  \
    snprintf(why_, sizeof why_, __VA_ARGS__);                                        \
    AH_LOG_E("registry", "plugin %s (%s): refused descriptor field %s: %s", m->name, \
             m->path ? m->path : "core", field, why_);                               \
    goto fail;                                                                       \
  } while (0)

/* ah_remote_param as ABI 1.0 laid it out: the stride of `params` for a descriptor without param_size. */
typedef struct remote_param_1_0 {
  const char *name;
  ah_type type;
  bool optional;
} remote_param_1_0;

int ah__remote_prepare(ah_mount *m, const ah_remote_def *def, ah__remote **out) {
  ah__remote *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  if (def->struct_size < offsetof(ah_remote_def, reserved))
    REFUSE("struct_size", "%u is smaller than the ABI's descriptor", def->struct_size);
  if (!ident(def->ns, true))
    REFUSE("ns", "namespace must match [a-z][a-z0-9_-]*");
  if (!ident(def->method, false))
    REFUSE("method", "method must match [a-z][A-Za-z0-9_]*");
  if (!def->fn)
    REFUSE("fn", "missing C function");
  if (def->nparams > 16 || (def->nparams && !def->params))
    REFUSE("params", "at most 16 parameters, and params must be set when nparams > 0");
  if (def->lookup < AH_LOOKUP_NONE || def->lookup > AH_LOOKUP_AGENT)
    REFUSE("lookup", "lookup kind must be NONE, SESSION or AGENT");
  if (def->flags & ~(uint32_t)(AH_REMOTE_CANCELLABLE | AH_REMOTE_LONG | AH_REMOTE_PRIVILEGED))
    REFUSE("flags", "unknown flag bits 0x%x", def->flags);
  if (def->result < AH_TYPE_VOID || def->result > AH_TYPE_JSON)
    REFUSE("result", "result type must be void, bool, int64, double, string or json");
  if (def->result_optional && def->result != AH_TYPE_STRING && def->result != AH_TYPE_JSON)
    REFUSE("result_optional", "only string and json results may be optional");
  /* The elements of `params` as the plugin's build lays them out (ABI 1.2; before it, the 1.0 layout). */
  size_t stride = AH_HAS(def, ah_remote_def, param_size) ? def->param_size : sizeof(remote_param_1_0);
  if (stride < sizeof(remote_param_1_0))
    REFUSE("param_size", "%zu is smaller than the ABI 1.0 parameter (%zu)", stride, sizeof(remote_param_1_0));
#define PARAM(i) ((const ah_remote_param *)(const void *)((const char *)def->params + (i)*stride))
  r->ns = strdup(def->ns);
  r->method = strdup(def->method);
  r->nparams = def->nparams;
  r->params = calloc(def->nparams ? def->nparams : 1, sizeof *r->params);
  r->arg_types = calloc(def->nparams + 2, sizeof *r->arg_types);
  if (!r->ns || !r->method || !r->params || !r->arg_types)
    goto nomem;
  for (size_t i = 0; i < def->nparams; i++) {
    const ah_remote_param *p = PARAM(i);
    char field[32];
    snprintf(field, sizeof field, "params[%zu]", i);
    if (!ident(p->name, false))
      REFUSE(field, "parameter name must match [a-z][A-Za-z0-9_]*");
    for (size_t j = 0; j < i; j++)
      if (strcmp(PARAM(j)->name, p->name) == 0)
        REFUSE(field, "duplicate parameter name '%s'", p->name);
    if (p->type < AH_TYPE_BOOL || p->type > AH_TYPE_AGENT)
      REFUSE(field, "parameter type must be bool, int64, double, string, json, session or agent");
    bool lookup_type = p->type == AH_TYPE_SESSION || p->type == AH_TYPE_AGENT;
    if (lookup_type) {
      ah_type want = def->lookup == AH_LOOKUP_SESSION ? AH_TYPE_SESSION
                     : def->lookup == AH_LOOKUP_AGENT ? AH_TYPE_AGENT
                                                      : AH_TYPE_INVALID;
      if (i != 0 || p->type != want || p->optional)
        REFUSE(field, "a %s parameter must be the first one, required, and match the lookup kind",
               ah__type_name(p->type));
    }
    r->params[i].name = strdup(p->name);
    if (!r->params[i].name)
      goto nomem;
    r->params[i].type = p->type;
    r->params[i].optional = p->optional;
    r->arg_types[i + 1] = param_ffi(p->type, p->optional);
  }
  if (def->lookup != AH_LOOKUP_NONE &&
      (def->nparams == 0 || (PARAM(0)->type != AH_TYPE_SESSION && PARAM(0)->type != AH_TYPE_AGENT)))
    REFUSE("lookup", "a lookup descriptor needs a session or agent as its first parameter");
  r->result = def->result;
  r->result_optional = def->result_optional;
  r->flags = def->flags;
  r->lookup = def->lookup;
  r->fn = def->fn;
#undef PARAM
  r->data = AH_HAS_FIELD(def, ah_remote_def, data) ? def->data : NULL;
  r->arg_types[0] = &ffi_type_pointer; /* ah_call * */
  r->nargs = (unsigned)def->nparams + 1;
  if (def->result != AH_TYPE_VOID)
    r->arg_types[r->nargs++] = &ffi_type_pointer; /* R *out */
  if (ffi_prep_cif(&r->cif, FFI_DEFAULT_ABI, r->nargs, &ffi_type_sint, r->arg_types) != FFI_OK)
    REFUSE("params", "libffi could not prepare the call interface");
  *out = r;
  return 0;
nomem:
  ah__remote_free(r);
  return AH_ENOMEM;
fail:
  ah__remote_free(r);
  return AH_EINVAL;
}
