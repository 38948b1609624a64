/* The remote gateway's core: describe and invoke remote descriptors (PROTOCOLS.md REMOTE-HOST-DISPATCH,
 * REMOTE-HOST-ERRORS, REMOTE-AGENT-RESOLVE; DECISIONS.md "Remote functions in C").
 *
 * An invocation is a call (calls.c) of the descriptor's mount, so withdraw cancels and drains it like a
 * method call. Per invocation:
 *   1. the descriptor is looked up again by name (withdrawn → unavailable, never a fallback);
 *   2. the argument object must hold exactly the descriptor's parameters, each of its type (missing,
 *      extra, mistyped → bad-request naming the field);
 *   3. a session/agent parameter is resolved to the live session (cold resume coalesced, lease fence →
 *      agent-busy), held until the function returned;
 *   4. the C function is called through libffi with (call, args…, &out) — on the loop thread, or on the
 *      thread pool for AH_REMOTE_LONG (the work counts on the descriptor's mount);
 *   5. the result is checked against the result type (a mismatch is logged and answered internal).
 * The cif is prepared per invocation from a copy of the argument types, so nothing of the registry entry
 * is used after step 1 except through the call (a zombie's entries may be freed while its call runs).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sessions.h"

#define MAX_PARAMS 16

typedef union value {
  bool b;
  int64_t i;
  double d;
  const char *s;
  json_t *j;
  ah_session *sess;
} value;

typedef union result {
  bool b;
  unsigned char raw_b;
  int64_t i;
  double d;
  char *s;
  json_t *j;
} result;

typedef struct invocation {
  ah_host *h;
  ah_call *call;
  char *name; /* "ns.method" */
  ah_remote_fn fn;
  uint32_t flags;
  ah_type result_type;
  bool result_optional;
  size_t nparams;
  ah_remote_param params[MAX_PARAMS]; /* copies of the descriptor's; names borrowed, or owned (long) */
  char *param_names[MAX_PARAMS];      /* the owned names of a long call */
  ffi_cif *cif;                       /* the entry's, or own_cif for a long call */
  ffi_cif own_cif;
  ffi_type *arg_types[MAX_PARAMS + 2];
  unsigned nargs;
  value vals[MAX_PARAMS];
  void *ptrs[MAX_PARAMS]; /* optional parameters: a pointer to vals[i], or NULL */
  void *avalues[MAX_PARAMS + 2];
  ah_call *call_arg;
  result out;
  result *out_ptr;
  int rc;
  ah_session *session; /* held while the function runs */
} invocation;

static void inv_free(invocation *v) {
  for (size_t i = 0; i < v->nparams; i++)
    free(v->param_names[i]);
  free(v->name);
  free(v);
}

/* ---- describe ------------------------------------------------------------------------------------- */

json_t *ah__remote_describe(ah_host *h) {
  json_t *out = json_array();
  if (!out || !h)
    return out;
  AH__LIST_EACH(it, &h->mounts) {
    const ah_mount *m = AH__CONTAINER(it, ah_mount, link);
    if (m->state != AH__MOUNT_ACTIVE)
      continue;
    AH__LIST_EACH(jt, &m->journal) {
      const ah__entry *e = AH__CONTAINER(jt, ah__entry, journal);
      if (e->kind != AH__ENTRY_REMOTE || e->state != AH__ST_ACTIVE)
        continue;
      json_t *d = ah__describe_remote(e);
      if (d)
        json_object_set_new(d, "plugin", json_string(m->name));
      json_array_append_new(out, d);
    }
  }
  return out;
}

/* ---- arguments ------------------------------------------------------------------------------------ */

/* Check `args` against the descriptor: exactly its parameters, each of its type. Fills v->vals/ptrs for
 * every parameter except a lookup one. Returns NULL or a message (malloc'ed) naming the field. */
static char *check_args(const ah__remote *r, const json_t *args, invocation *v) {
  char *msg = NULL;
  if (!json_is_object(args)) {
    if (asprintf(&msg, "args: must be an object of named fields") < 0)
      msg = NULL;
    return msg;
  }
  const char *k = NULL;
  json_t *x = NULL;
  json_object_foreach((json_t *)args, k, x) {
    bool known = false;
    for (size_t i = 0; i < r->nparams && !known; i++)
      known = strcmp(r->params[i].name, k) == 0;
    if (!known) {
      if (asprintf(&msg, "args.%.64s: %s.%s has no such parameter", k, r->ns, r->method) < 0)
        msg = NULL;
      return msg;
    }
  }
  for (size_t i = 0; i < r->nparams; i++) {
    const ah_remote_param *p = &r->params[i];
    json_t *a = json_object_get(args, p->name);
    if (!a || (p->optional && json_is_null(a))) {
      if (p->optional) {
        v->ptrs[i] = NULL;
        continue;
      }
      if (asprintf(&msg, "args.%s: missing (%s)", p->name, ah__type_name(p->type)) < 0)
        msg = NULL;
      return msg;
    }
    bool ok = false;
    switch (p->type) {
    case AH_TYPE_BOOL:
      ok = json_is_boolean(a);
      v->vals[i].b = json_is_true(a);
      break;
    case AH_TYPE_INT64:
      ok = json_is_integer(a);
      v->vals[i].i = json_integer_value(a);
      break;
    case AH_TYPE_DOUBLE:
      ok = json_is_number(a);
      v->vals[i].d = json_number_value(a);
      break;
    case AH_TYPE_STRING:
    case AH_TYPE_SESSION:
    case AH_TYPE_AGENT:
      /* A string with an embedded NUL would reach C truncated: refused. */
      ok = json_is_string(a) && strlen(json_string_value(a)) == json_string_length(a);
      v->vals[i].s = json_string_value(a);
      break;
    case AH_TYPE_JSON:
      ok = true;
      v->vals[i].j = a;
      break;
    default:
      break;
    }
    if (ok && (p->type == AH_TYPE_SESSION || p->type == AH_TYPE_AGENT) && json_string_length(a) == 0)
      ok = false;
    if (!ok) {
      const char *want = p->type == AH_TYPE_SESSION || p->type == AH_TYPE_AGENT ? "a session id (string)"
                         : p->type == AH_TYPE_STRING                            ? "a string without NUL"
                                                                                : ah__type_name(p->type);
      if (asprintf(&msg, "args.%s: expected %s", p->name, want) < 0)
        msg = NULL;
      return msg;
    }
    /* Optional: bool, int64 and double by pointer; string and json are pointers already. */
    v->ptrs[i] = !p->optional                ? NULL
                 : p->type == AH_TYPE_STRING ? (void *)v->vals[i].s
                 : p->type == AH_TYPE_JSON   ? (void *)v->vals[i].j
                                             : (void *)&v->vals[i];
  }
  return NULL;
}

/* ---- the call ------------------------------------------------------------------------------------- */

static bool known_category(int rc) {
  return rc == AH_EINVAL || rc == AH_ENOENT || rc == AH_EAGENTBUSY || rc == AH_EPERM ||
         rc == AH_EUNAVAILABLE || rc == AH_ECANCELED;
}

/* The function's outcome → the caller's. */
static void finish(invocation *v) {
  ah_call *c = v->call;
  if (v->session) {
    ah__session_release(v->session);
    v->session = NULL;
  }
  bool tripped = c->cancellable && ah__cancel_tripped(c->token);
  if (v->rc != 0) {
    if (v->result_type == AH_TYPE_STRING)
      free(v->out.s);
    else if (v->result_type == AH_TYPE_JSON)
      json_decref(v->out.j);
    if (tripped || v->rc == AH_ECANCELED) {
      ah__call_error(c, AH_ECANCELED, "cancelled", NULL);
    } else if (v->rc < 0 && known_category(v->rc)) {
      char msg[600];
      snprintf(msg, sizeof msg, "%s: %s", v->name, c->fail_message ? c->fail_message : ah_strerror(v->rc));
      ah__call_error(c, v->rc, msg, NULL);
    } else {
      AH_LOG_W("remote", "%s returned %d (%s)", v->name, v->rc,
               v->rc < 0 ? ah_err_name(v->rc) : "not 0 or an AH_E* code");
      ah__call_error(c, AH_EINTERNAL, "internal error", NULL);
    }
    inv_free(v);
    return;
  }
  json_t *value = NULL;
  const char *mismatch = NULL;
  switch (v->result_type) {
  case AH_TYPE_VOID:
    value = json_null();
    break;
  case AH_TYPE_BOOL:
    if (v->out.raw_b > 1)
      mismatch = "a bool that is neither true nor false";
    else
      value = json_boolean(v->out.raw_b);
    break;
  case AH_TYPE_INT64:
    value = json_integer(v->out.i);
    break;
  case AH_TYPE_DOUBLE:
    if (!isfinite(v->out.d))
      mismatch = "a double that is NaN or infinite (not JSON)";
    else
      value = json_real(v->out.d);
    break;
  case AH_TYPE_STRING:
    if (!v->out.s) {
      if (v->result_optional)
        value = json_null();
      else
        mismatch = "NULL for a required string";
    } else {
      value = json_string(v->out.s);
      if (!value)
        mismatch = "a string that is not valid UTF-8";
    }
    free(v->out.s);
    break;
  case AH_TYPE_JSON:
    if (!v->out.j) {
      if (v->result_optional)
        value = json_null();
      else
        mismatch = "NULL for a required json value";
    } else {
      value = v->out.j;
    }
    break;
  default:
    mismatch = "an unknown result type";
    break;
  }
  if (mismatch) {
    AH_LOG_E("remote", "%s: result mismatch: %s", v->name, mismatch);
    ah__call_error(c, AH_EINTERNAL, "internal error: the result does not match the descriptor", NULL);
  } else {
    ah__call_reply(c, value);
  }
  inv_free(v);
}

static void run_fn(invocation *v) {
  ffi_arg rv = 0;
  ffi_call(v->cif, FFI_FN(v->fn), &rv, v->avalues);
  v->rc = (int)(ffi_sarg)rv;
}

static void work_run(void *arg) {
  run_fn(arg);
}

static void work_after(void *arg, int status) {
  invocation *v = arg;
  if (status == AH_ECANCELED) /* withdraw cancelled the work before it started: the function never ran */
    v->rc = AH_ECANCELED;
  finish(v);
}

static void invoke(invocation *v) {
  ah_call *c = v->call;
  if (c->answered) { /* cancelled while the lookup ran: never call the function */
    v->rc = AH_ECANCELED;
    finish(v);
    return;
  }
  v->call_arg = c;
  v->avalues[0] = &v->call_arg;
  for (size_t i = 0; i < v->nparams; i++)
    v->avalues[i + 1] = v->params[i].optional ? (void *)&v->ptrs[i] : (void *)&v->vals[i];
  memset(&v->out, 0, sizeof v->out);
  v->out_ptr = &v->out;
  if (v->result_type != AH_TYPE_VOID)
    v->avalues[v->nparams + 1] = &v->out_ptr;
  if (v->flags & AH_REMOTE_LONG) {
    int rc = ah__services_queue_work(c->mount, work_run, work_after, v);
    if (rc) {
      v->rc = rc == AH_ESTATE ? AH_EUNAVAILABLE : rc;
      finish(v);
    }
    return;
  }
  run_fn(v);
  finish(v);
}

static void on_lookup(int status, ah_session *s, void *arg) {
  invocation *v = arg;
  if (status) {
    const char *pname = v->params[0].name;
    char msg[200];
    int rc = status;
    if (status == AH_ENOENT || status == AH_ECLOSED) {
      rc = AH_ENOENT;
      snprintf(msg, sizeof msg, "args.%s: %s", pname,
               status == AH_ENOENT ? "no such session" : "the session is closed");
    } else if (status == AH_EAGENTBUSY) {
      snprintf(msg, sizeof msg, "args.%s: the session's agent is owned by another process", pname);
    } else if (status == AH_ESTATE) {
      rc = AH_EUNAVAILABLE;
      snprintf(msg, sizeof msg, "the host is stopping");
    } else {
      rc = AH_EINTERNAL;
      snprintf(msg, sizeof msg, "internal error while resolving args.%s", pname);
    }
    if (v->call->answered)
      rc = AH_ECANCELED;
    ah__call_error(v->call, rc, msg, NULL);
    inv_free(v);
    return;
  }
  ah__session_hold(s);
  v->session = s;
  v->vals[0].sess = s;
  invoke(v);
}

int ah__remote_invoke(ah_host *h, const ah_caller *caller, const char *ns, const char *method,
                      const json_t *args, ah_cancel *parent, ah_reply_fn cb, void *arg) {
  if (!h || !caller || !ns || !method || !args || !cb ||
      caller->struct_size < offsetof(ah_caller, reserved) || caller->authority < AH_AUTH_LAN ||
      caller->authority > AH_AUTH_ADMIN)
    return AH_EINVAL;
  if (h->stopping)
    return AH_ESTATE;
  char name[160];
  if (strlen(ns) > 64 || strlen(method) > 64) {
    ah__complete(h, cb, arg, AH_ENOENT, NULL, "no such descriptor", NULL);
    return 0;
  }
  snprintf(name, sizeof name, "%s.%s", ns, method);
  ah__entry *e = ah__registry_find(&h->reg, AH__ENTRY_REMOTE, name);
  char msg[256];
  if (!e || e->state == AH__ST_STAGED) {
    bool gone = ah__registry_tombstoned(&h->reg, AH__ENTRY_REMOTE, name);
    snprintf(msg, sizeof msg, "%s: %s", name, gone ? "withdrawn" : "no such descriptor");
    ah__complete(h, cb, arg, gone ? AH_EUNAVAILABLE : AH_ENOENT, NULL, msg, NULL);
    return 0;
  }
  if (e->state != AH__ST_ACTIVE || e->mount->state != AH__MOUNT_ACTIVE) {
    snprintf(msg, sizeof msg, "%s: withdrawn", name);
    ah__complete(h, cb, arg, AH_EUNAVAILABLE, NULL, msg, NULL);
    return 0;
  }
  const ah__remote *r = e->remote;
  bool priv = (r->flags & AH_REMOTE_PRIVILEGED) != 0;
  if (priv && !ah__privileged(caller->authority)) {
    AH_LOG_W("remote", "refused privileged descriptor %s to a non-privileged caller on %s", name,
             caller->surface ? caller->surface : "?");
    ah__audit(h, name, caller, AH_EPERM);
    snprintf(msg, sizeof msg, "%s: not permitted for this caller", name);
    ah__complete(h, cb, arg, AH_EPERM, NULL, msg, NULL);
    return 0;
  }
  invocation *v = calloc(1, sizeof *v);
  if (!v || !(v->name = strdup(name))) {
    free(v);
    return AH_ENOMEM;
  }
  v->h = h;
  v->fn = r->fn;
  v->flags = r->flags;
  v->result_type = r->result;
  v->result_optional = r->result_optional;
  v->nparams = r->nparams;
  /* The entry lives as long as the call counts on its mount (withdraw removes it after the drain), except
   * when a call outlives the drain deadline — only a long call on the pool can. So a loop-thread call uses
   * the entry's prepared cif and names; a long one takes copies. */
  bool copy = (r->flags & AH_REMOTE_LONG) != 0;
  for (size_t i = 0; i < r->nparams; i++) {
    v->params[i] = r->params[i];
    if (copy) {
      v->param_names[i] = strdup(r->params[i].name);
      if (!v->param_names[i]) {
        inv_free(v);
        return AH_ENOMEM;
      }
      v->params[i].name = v->param_names[i];
    }
  }
  v->cif = (ffi_cif *)&r->cif;
  if (copy) {
    memcpy(v->arg_types, r->arg_types, r->nargs * sizeof *v->arg_types);
    v->nargs = r->nargs;
    if (ffi_prep_cif(&v->own_cif, FFI_DEFAULT_ABI, v->nargs, &ffi_type_sint, v->arg_types) != FFI_OK) {
      inv_free(v);
      ah__complete(h, cb, arg, AH_EINTERNAL, NULL, "internal error", NULL);
      return 0;
    }
    v->cif = &v->own_cif;
  }
  char *bad = check_args(r, args, v);
  if (bad) {
    ah__complete(h, cb, arg, AH_EINVAL, NULL, bad, NULL);
    free(bad);
    inv_free(v);
    return 0;
  }
  /* The call keeps a reference to the arguments: string and json values point into them. */
  ah_call *c = NULL;
  int rc = ah__call_new(h, e, caller, name, json_incref((json_t *)args),
                        (r->flags & AH_REMOTE_CANCELLABLE) != 0, priv, parent, cb, arg, &c);
  if (rc || !c) {
    inv_free(v);
    return rc;
  }
  v->call = c;
  if (r->lookup != AH_LOOKUP_NONE) {
    ah_sessions *sessions = ah__host_sessions(h);
    if (!sessions) {
      ah__call_error(c, AH_EUNAVAILABLE, "sessions need a state directory", NULL);
      inv_free(v);
      return 0;
    }
    /* The id string lives in the call's params until the call is freed. */
    ah__sessions_lookup(sessions, v->vals[0].s, on_lookup, v);
    return 0;
  }
  invoke(v);
  return 0;
}
