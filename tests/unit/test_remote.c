/* The remote gateway's core (host/remote.c; PROTOCOLS.md REMOTE-GATEWAY-TYPES, REMOTE-HOST-DISPATCH,
 * REMOTE-HOST-ERRORS, REMOTE-AGENT-RESOLVE, REMOTE-EVENT-ALLOWLIST / FORWARD): every conversion both ways,
 * the exact field set, every error category, tokens only for cancellable descriptors, withdraw during a call,
 * session and agent lookups. The descriptors are the real fixture plugin tests/plugins/remote-types.c, called
 * through libffi. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host_support.h"
#include "internal.h"
#include "sessions.h"
#include "support.h"

/* json_equal with a freshly packed expected value, which it frees. */
static bool equal_packed(const json_t *got, json_t *want) {
  bool eq = json_equal(got, want);
  json_decref(want);
  return eq;
}

typedef struct rworld {
  uv_loop_t loop;
  char *dir;
  char *state;
  ah_config cfg;
  ah_host *h;
} rworld;

static ah_host *rhost(rworld *w) {
  ah_host *h = NULL;
  ah_host_opts opts = {.loop = &w->loop, .config = &w->cfg, .mode = "serve", .drain_ms = 1000};
  cr_assert_eq(ah__host_new(&opts, &h), 0);
  cr_assert_eq(th_load(h, "remote-types", NULL), 0);
  return h;
}

static void up(rworld *w) {
  memset(w, 0, sizeof *w);
  cr_assert_eq(uv_loop_init(&w->loop), 0);
  w->dir = ts_mkdtemp();
  cr_assert(asprintf(&w->state, "%s/state", w->dir) > 0);
  w->cfg.state_dir = w->state;
  w->cfg.default_provider = "echo";
  w->h = rhost(w);
}

static void down(rworld *w) {
  if (w->h)
    cr_assert_eq(th_host_stop_free(&w->loop, w->h), 0);
  else
    cr_assert_eq(ts_loop_close(&w->loop), 0);
  ts_rmtree(w->dir);
  free(w->dir);
  free(w->state);
}

static const ah_caller lan = {.struct_size = sizeof(ah_caller), .authority = AH_AUTH_LAN, .surface = "test"};
static const ah_caller loopback = {
    .struct_size = sizeof(ah_caller), .authority = AH_AUTH_LOOPBACK, .surface = "test"};

/* Invoke types.<method> with `args` (stolen) and wait for the outcome. */
static ts_outcome invoke_as(rworld *w, const ah_caller *c, const char *method, json_t *args) {
  ts_outcome o;
  memset(&o, 0, sizeof o);
  int rc = ah__remote_invoke(w->h, c, "types", method, args, NULL, th_reply, &o);
  json_decref(args);
  cr_assert_eq(rc, 0, "%s: %s", method, ah_err_name(rc));
  cr_assert(ts_run_until(&w->loop, &o.done, 10000), "%s: no outcome", method);
  return o;
}

static ts_outcome invoke(rworld *w, const char *method, json_t *args) {
  return invoke_as(w, &lan, method, args);
}

/* The value of a successful invocation (owned). */
static json_t *value(rworld *w, const char *method, json_t *args) {
  ts_outcome o = invoke(w, method, args);
  cr_assert_eq(o.status, 0, "%s: %s %s", method, ah_err_name(o.status), o.message ? o.message : "");
  free(o.message);
  return o.result;
}

/* The error of a failed invocation: asserts the code and that the message contains `part`. */
static void error_is(rworld *w, const char *method, json_t *args, int code, const char *part) {
  ts_outcome o = invoke(w, method, args);
  cr_assert_eq(o.status, code, "%s: got %s (%s), want %s", method, ah_err_name(o.status),
               o.message ? o.message : "", ah_err_name(code));
  if (part)
    cr_assert(o.message && strstr(o.message, part), "%s: message '%s' lacks '%s'", method, o.message, part);
  th_outcome_clear(&o);
}

static void roundtrip(rworld *w, const char *method, const char *field, json_t *in, json_t *want) {
  json_t *got = value(w, method, json_pack("{s:O}", field, in));
  char *g = json_dumps(got, JSON_ENCODE_ANY);
  cr_assert(json_equal(got, want), "%s(%s) gave %s", method, field, g);
  free(g);
  json_decref(got);
  json_decref(in);
  json_decref(want);
}

TestSuite(remote, .timeout = 60);

Test(remote, every_type_converts_both_ways) {
  rworld w;
  up(&w);
  roundtrip(&w, "echo_bool", "b", json_true(), json_true());
  roundtrip(&w, "echo_bool", "b", json_false(), json_false());
  roundtrip(&w, "echo_int", "i", json_integer(0), json_integer(0));
  roundtrip(&w, "echo_int", "i", json_integer(-1), json_integer(-1));
  roundtrip(&w, "echo_int", "i", json_integer(INT64_MAX), json_integer(INT64_MAX));
  roundtrip(&w, "echo_int", "i", json_integer(INT64_MIN), json_integer(INT64_MIN));
  roundtrip(&w, "echo_double", "d", json_real(1.5), json_real(1.5));
  roundtrip(&w, "echo_double", "d", json_real(-1e300), json_real(-1e300));
  roundtrip(&w, "echo_double", "d", json_integer(3), json_real(3.0)); /* an integer is a number */
  roundtrip(&w, "echo_string", "s", json_string(""), json_string(""));
  roundtrip(&w, "echo_string", "s", json_string("h\xc3\xa9llo \xe2\x9c\x93"),
            json_string("h\xc3\xa9llo \xe2\x9c\x93"));
  char *big = malloc(100001);
  memset(big, 'x', 100000);
  big[100000] = '\0';
  roundtrip(&w, "echo_string", "s", json_string(big), json_string(big));
  free(big);
  roundtrip(&w, "echo_json", "j", json_pack("{s:[i,{s:n}]}", "a", 1, "b"),
            json_pack("{s:[i,{s:n}]}", "a", 1, "b"));
  roundtrip(&w, "echo_json", "j", json_null(), json_null());
  json_t *v = value(&w, "nothing", json_object());
  cr_assert(json_is_null(v), "void → null");
  json_decref(v);
  /* Optional parameters: absent and null are NULL; present ones are passed by pointer. */
  v = value(&w, "optionals", json_pack("{s:n}", "s"));
  cr_assert(equal_packed(v, json_pack("{s:s, s:s, s:s, s:s, s:s}", "b", "absent", "i", "absent", "d",
                                      "absent", "s", "absent", "j", "absent")));
  json_decref(v);
  v = value(
      &w, "optionals",
      json_pack("{s:b, s:I, s:f, s:s, s:[i]}", "b", 0, "i", (json_int_t)-7, "d", 0.25, "s", "x", "j", 9));
  cr_assert(equal_packed(
      v, json_pack("{s:b, s:I, s:f, s:s, s:[i]}", "b", 0, "i", (json_int_t)-7, "d", 0.25, "s", "x", "j", 9)));
  json_decref(v);
  v = value(&w, "maybe_string", json_pack("{s:b}", "give", 1));
  cr_assert_str_eq(json_string_value(v), "given");
  json_decref(v);
  v = value(&w, "maybe_string", json_pack("{s:b}", "give", 0));
  cr_assert(json_is_null(v), "an optional string result may be null");
  json_decref(v);
  down(&w);
}

Test(remote, the_field_set_must_be_exact_and_typed) {
  rworld w;
  up(&w);
  error_is(&w, "echo_bool", json_object(), AH_EINVAL, "args.b: missing (bool)");
  error_is(&w, "echo_bool", json_pack("{s:b, s:i}", "b", 1, "x", 1), AH_EINVAL, "args.x:");
  error_is(&w, "echo_bool", json_pack("{s:i}", "b", 1), AH_EINVAL, "args.b: expected bool");
  error_is(&w, "echo_int", json_pack("{s:f}", "i", 1.5), AH_EINVAL, "args.i: expected int64");
  error_is(&w, "echo_int", json_pack("{s:s}", "i", "1"), AH_EINVAL, "args.i: expected int64");
  error_is(&w, "echo_double", json_pack("{s:s}", "d", "x"), AH_EINVAL, "args.d: expected double");
  error_is(&w, "echo_string", json_pack("{s:i}", "s", 1), AH_EINVAL, "args.s: expected a string");
  error_is(&w, "echo_string", json_pack("{s:s%}", "s", "a\0b", (size_t)3), AH_EINVAL, "without NUL");
  error_is(&w, "echo_json", json_object(), AH_EINVAL, "args.j: missing (json)");
  error_is(&w, "optionals", json_pack("{s:s}", "b", "yes"), AH_EINVAL, "args.b: expected bool");
  error_is(&w, "title", json_pack("{s:i}", "session", 3), AH_EINVAL, "args.session: expected a session id");
  error_is(&w, "title", json_pack("{s:s}", "session", ""), AH_EINVAL, "args.session");
  ts_outcome o;
  memset(&o, 0, sizeof o);
  json_t *arr = json_array();
  cr_assert_eq(ah__remote_invoke(w.h, &lan, "types", "nothing", arr, NULL, th_reply, &o), 0);
  json_decref(arr);
  cr_assert(ts_run_until(&w.loop, &o.done, 5000));
  cr_assert_eq(o.status, AH_EINVAL, "args that are not an object");
  th_outcome_clear(&o);
  down(&w);
}

Test(remote, every_error_category) {
  rworld w;
  up(&w);
  /* Failures the function reports keep their category; anything else is internal. */
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_EINVAL), AH_EINVAL, "types.fail");
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_ENOENT), AH_ENOENT, NULL);
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_EAGENTBUSY), AH_EAGENTBUSY, NULL);
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_EPERM), AH_EPERM, NULL);
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_EUNAVAILABLE), AH_EUNAVAILABLE, NULL);
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_ECANCELED), AH_ECANCELED, NULL);
  error_is(&w, "fail", json_pack("{s:i}", "code", AH_EIO), AH_EINTERNAL, "internal error");
  error_is(&w, "fail", json_pack("{s:i}", "code", 5), AH_EINTERNAL, "internal error");
  /* Results that do not match the descriptor: internal, logged. */
  error_is(&w, "bad_bool", json_object(), AH_EINTERNAL, "does not match");
  error_is(&w, "nan", json_object(), AH_EINTERNAL, "does not match");
  error_is(&w, "null_string", json_object(), AH_EINTERNAL, "does not match");
  error_is(&w, "bad_utf8", json_object(), AH_EINTERNAL, "does not match");
  /* Unknown descriptors are not-found; privileged ones are forbidden to a LAN caller. */
  error_is(&w, "no_such", json_object(), AH_ENOENT, "no such descriptor");
  error_is(&w, "admin", json_object(), AH_EPERM, "not permitted");
  ts_outcome o = invoke_as(&w, &loopback, "admin", json_object());
  cr_assert_eq(o.status, 0);
  cr_assert(json_is_true(o.result));
  th_outcome_clear(&o);
  /* Bad calls of the API itself are refused without an outcome. */
  cr_assert_eq(ah__remote_invoke(w.h, &lan, "types", "nothing", NULL, NULL, th_reply, &o), AH_EINVAL);
  down(&w);
}

Test(remote, a_token_only_for_cancellable_descriptors) {
  rworld w;
  up(&w);
  json_t *v = value(&w, "token", json_object());
  cr_assert(json_is_false(v), "a descriptor without AH_REMOTE_CANCELLABLE gets no token");
  json_decref(v);
  v = value(&w, "token_c", json_object());
  cr_assert(json_is_true(v), "a cancellable descriptor gets its token");
  json_decref(v);
  down(&w);
}

Test(remote, withdraw_during_a_cancellable_call_cancels_it_then_unavailable) {
  rworld w;
  up(&w);
  ts_outcome o;
  memset(&o, 0, sizeof o);
  json_t *args = json_pack("{s:i}", "ms", 20000);
  cr_assert_eq(ah__remote_invoke(w.h, &lan, "types", "slow", args, NULL, th_reply, &o), 0);
  json_decref(args);
  ts_run_until(&w.loop, &o.done, 100); /* let the pool start it */
  cr_assert(!o.done, "the slow call is running");
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(th_unload(&w.loop, w.h, "remote-types"), 0);
  cr_assert(o.done, "answered by the withdraw");
  cr_assert_eq(o.status, AH_ECANCELED, "got %s", ah_err_name(o.status));
  uint64_t ms = o.at_ms - t0;
  cr_assert_lt(ms, 1000, "cancelled %llu ms after the unload began", (unsigned long long)ms);
  cr_assert_null(ah__host_find_mount(w.h, "remote-types"), "unmapped, not a zombie: the call returned");
  th_outcome_clear(&o);
  error_is(&w, "echo_int", json_pack("{s:i}", "i", 1), AH_EUNAVAILABLE, "withdrawn");
  json_t *d = ah__remote_describe(w.h);
  cr_assert_eq(json_array_size(d), 0, "nothing described after the withdraw");
  json_decref(d);
  /* Mounted again, it serves again. */
  cr_assert_eq(th_load(w.h, "remote-types", NULL), 0);
  json_t *v = value(&w, "echo_int", json_pack("{s:i}", "i", 4));
  cr_assert_eq(json_integer_value(v), 4);
  json_decref(v);
  down(&w);
}

Test(remote, the_callers_token_cancels_a_call) {
  rworld w;
  up(&w);
  ah_cancel *parent = ah__cancel_new(NULL);
  ts_outcome o;
  memset(&o, 0, sizeof o);
  json_t *args = json_pack("{s:i}", "ms", 20000);
  cr_assert_eq(ah__remote_invoke(w.h, &lan, "types", "slow", args, parent, th_reply, &o), 0);
  json_decref(args);
  ts_run_until(&w.loop, &o.done, 100);
  uint64_t t0 = ts_now_ms();
  ah__cancel_trip(parent);
  cr_assert(ts_run_until(&w.loop, &o.done, 5000));
  cr_assert_eq(o.status, AH_ECANCELED);
  cr_assert_lt(o.at_ms - t0, 1000);
  th_outcome_clear(&o);
  /* The function saw its token and returned: the mount drains at once. */
  cr_assert_eq(th_unload(&w.loop, w.h, "remote-types"), 0);
  cr_assert_null(ah__host_find_mount(w.h, "remote-types"));
  ah__cancel_free(parent);
  down(&w);
}

Test(remote, describe_lists_every_descriptor_with_its_types) {
  rworld w;
  up(&w);
  json_t *d = ah__remote_describe(w.h);
  cr_assert_eq(json_array_size(d), 20);
  bool seen_slow = false, seen_opt = false;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(d, i, e) {
    cr_assert_str_eq(json_string_value(json_object_get(e, "plugin")), "remote-types");
    cr_assert_str_eq(json_string_value(json_object_get(e, "namespace")), "types");
    const char *m = json_string_value(json_object_get(e, "method"));
    if (strcmp(m, "slow") == 0) {
      seen_slow = json_is_true(json_object_get(e, "cancellable"));
      cr_assert_str_eq(json_string_value(json_object_get(e, "result")), "bool");
    } else if (strcmp(m, "optionals") == 0) {
      json_t *p = json_array_get(json_object_get(e, "params"), 3);
      seen_opt = strcmp(json_string_value(json_object_get(p, "type")), "string") == 0 &&
                 json_is_true(json_object_get(p, "optional"));
    } else if (strcmp(m, "title") == 0) {
      cr_assert_str_eq(json_string_value(json_object_get(e, "lookup")), "session");
    }
  }
  cr_assert(seen_slow && seen_opt);
  json_decref(d);
  down(&w);
}

/* ---- lookups ---------------------------------------------------------------------------------------- */

static char *create_session(rworld *w, const char *title) {
  ts_outcome o;
  char *cwd = NULL;
  cr_assert(asprintf(&cwd, "%s", w->dir) > 0);
  cr_assert_eq(th_call(&w->loop, w->h, AH_AUTH_ADMIN, "session.create",
                       json_pack("{s:s, s:s}", "cwd", cwd, "title", title), &o),
               0);
  free(cwd);
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  char *id = strdup(json_string_value(json_object_get(o.result, "sessionId")));
  th_outcome_clear(&o);
  return id;
}

Test(remote, session_and_agent_lookups) {
  rworld w;
  up(&w);
  char *id = create_session(&w, "first");
  json_t *v = value(&w, "title", json_pack("{s:s}", "session", id));
  cr_assert_str_eq(json_string_value(v), "first");
  json_decref(v);
  v = value(&w, "agent_id", json_pack("{s:s}", "agent", id));
  cr_assert_str_eq(json_string_value(v), id);
  json_decref(v);
  v = value(&w, "rename", json_pack("{s:s, s:s}", "session", id, "title", "renamed"));
  json_decref(v);
  ts_outcome o;
  cr_assert_eq(th_call(&w.loop, w.h, AH_AUTH_ADMIN, "session.get", json_pack("{s:s}", "sessionId", id), &o),
               0);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(o.result, "session"), "title")),
                   "renamed");
  th_outcome_clear(&o);
  error_is(&w, "title", json_pack("{s:s}", "session", "0190aaaa-0000-7000-8000-000000000000"), AH_ENOENT,
           "args.session: no such session");
  error_is(&w, "agent_id", json_pack("{s:s}", "agent", "nope"), AH_ENOENT, "args.agent: no such session");
  /* A title the store refuses is a bad request from the function. */
  char longer[300];
  memset(longer, 'x', sizeof longer - 1);
  longer[sizeof longer - 1] = '\0';
  error_is(&w, "rename", json_pack("{s:s, s:s}", "session", id, "title", longer), AH_EINVAL, NULL);
  free(id);
  down(&w);
}

typedef struct many {
  ts_outcome o[5];
} many;

static bool all_done(void *arg) {
  many *m = arg;
  for (int i = 0; i < 5; i++)
    if (!m->o[i].done)
      return false;
  return true;
}

Test(remote, concurrent_cold_lookups_resume_once_and_a_second_owner_is_agent_busy) {
  rworld w;
  up(&w);
  char *id = create_session(&w, "cold");
  /* A second host on the same state dir: the session is cold there. */
  cr_assert_eq(th_host_stop_free(&w.loop, w.h), 0);
  cr_assert_eq(uv_loop_init(&w.loop), 0);
  w.h = rhost(&w);
  many m;
  memset(&m, 0, sizeof m);
  json_t *args = json_pack("{s:s}", "session", id);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(ah__remote_invoke(w.h, &lan, "types", "title", args, NULL, th_reply, &m.o[i]), 0);
  json_decref(args);
  cr_assert(ts_run_until_pred(&w.loop, all_done, &m, 10000));
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(m.o[i].status, 0, "%s", m.o[i].message ? m.o[i].message : "");
    cr_assert_str_eq(json_string_value(m.o[i].result), "cold");
    th_outcome_clear(&m.o[i]);
  }
  cr_assert_eq(ah__sessions_loads(ah__host_sessions(w.h)), 1, "five concurrent lookups, one resume");
  /* A third host while the second holds the lease: agent-busy. */
  uv_loop_t loop2;
  cr_assert_eq(uv_loop_init(&loop2), 0);
  ah_host *h2 = NULL;
  ah_host_opts opts = {.loop = &loop2, .config = &w.cfg, .mode = "serve", .drain_ms = 1000};
  cr_assert_eq(ah__host_new(&opts, &h2), 0);
  cr_assert_eq(th_load(h2, "remote-types", NULL), 0);
  ts_outcome o;
  memset(&o, 0, sizeof o);
  args = json_pack("{s:s}", "session", id);
  cr_assert_eq(ah__remote_invoke(h2, &lan, "types", "title", args, NULL, th_reply, &o), 0);
  json_decref(args);
  cr_assert(ts_run_until(&loop2, &o.done, 10000));
  cr_assert_eq(o.status, AH_EAGENTBUSY, "got %s", ah_err_name(o.status));
  cr_assert(strstr(o.message, "owned by another process"));
  th_outcome_clear(&o);
  cr_assert_eq(th_host_stop_free(&loop2, h2), 0);
  free(id);
  down(&w);
}

/* ---- the remote plugin (plugins/remote): remote.describe, remote.invoke, forwarding, services ------------
 */

static void load_remote_plugin(rworld *w) {
  const char *root = getenv("AH_TEST_BUILD_ROOT");
  cr_assert_not_null(root, "AH_TEST_BUILD_ROOT is set by meson");
  char *path = NULL;
  cr_assert(asprintf(&path, "%s/plugins/remote/remote.so", root) > 0);
  char *why = NULL;
  int rc = ah__host_load(w->h, path, NULL, NULL, &why);
  cr_assert_eq(rc, 0, "%s: %s", path, why ? why : ah_err_name(rc));
  free(why);
  free(path);
}

static ts_outcome call_as(rworld *w, ah_authority a, const char *method, json_t *params) {
  ts_outcome o;
  memset(&o, 0, sizeof o);
  int rc = th_call(&w->loop, w->h, a, method, params, &o);
  cr_assert_eq(rc, 0, "%s: %s", method, ah_err_name(rc));
  return o;
}

static json_t *rinvoke_ok(rworld *w, ah_authority a, const char *ns, const char *method, json_t *args) {
  ts_outcome o = call_as(w, a, "remote.invoke",
                         json_pack("{s:s, s:s, s:o}", "namespace", ns, "method", method, "args", args));
  cr_assert_eq(o.status, 0, "%s.%s: %s %s", ns, method, ah_err_name(o.status), o.message ? o.message : "");
  free(o.message);
  return o.result;
}

static void rinvoke_err(rworld *w, ah_authority a, json_t *params, int code, const char *part) {
  ts_outcome o = call_as(w, a, "remote.invoke", params);
  cr_assert_eq(o.status, code, "got %s (%s)", ah_err_name(o.status), o.message ? o.message : "");
  if (part)
    cr_assert(o.message && strstr(o.message, part), "message '%s' lacks '%s'", o.message, part);
  th_outcome_clear(&o);
}

Test(remote, the_plugin_describes_and_invokes_with_typed_errors) {
  rworld w;
  up(&w);
  load_remote_plugin(&w);
  ts_outcome o = call_as(&w, AH_AUTH_LAN, "remote.describe", NULL);
  cr_assert_eq(o.status, 0);
  json_t *d = json_object_get(o.result, "descriptors");
  cr_assert_eq(json_array_size(d), 25, "20 fixture descriptors and the 5 built-in services");
  th_outcome_clear(&o);
  json_t *v = rinvoke_ok(&w, AH_AUTH_LAN, "types", "echo_int", json_pack("{s:i}", "i", 42));
  cr_assert_eq(json_integer_value(v), 42);
  json_decref(v);
  rinvoke_err(&w, AH_AUTH_LAN,
              json_pack("{s:s, s:s, s:{}, s:i}", "namespace", "types", "method", "nothing", "args", "x", 1),
              AH_EINVAL, "only namespace, method and args");
  rinvoke_err(&w, AH_AUTH_LAN, json_pack("{s:i, s:s}", "namespace", 1, "method", "nothing"), AH_EINVAL,
              "must be strings");
  rinvoke_err(&w, AH_AUTH_LAN,
              json_pack("{s:s, s:s, s:[]}", "namespace", "types", "method", "nothing", "args"), AH_EINVAL,
              "params.args");
  rinvoke_err(&w, AH_AUTH_LAN,
              json_pack("{s:s, s:s, s:{s:s}}", "namespace", "types", "method", "echo_int", "args", "i", "x"),
              AH_EINVAL, "args.i: expected int64");
  rinvoke_err(&w, AH_AUTH_LAN, json_pack("{s:s, s:s}", "namespace", "types", "method", "gone"), AH_ENOENT,
              "no such descriptor");
  rinvoke_err(&w, AH_AUTH_LAN, json_pack("{s:s, s:s}", "namespace", "types", "method", "admin"), AH_EPERM,
              NULL);
  /* Absent args are an empty object. */
  v = rinvoke_ok(&w, AH_AUTH_LAN, "types", "nothing", json_object());
  cr_assert(json_is_null(v));
  json_decref(v);
  /* The caller's token reaches the invocation: a cancelled remote.invoke cancels the slow function. */
  ah_cancel *parent = ah__cancel_new(NULL);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_LAN, .surface = "test"};
  memset(&o, 0, sizeof o);
  cr_assert_eq(ah__host_dispatch(w.h, &c, "remote.invoke",
                                 json_pack("{s:s, s:s, s:{s:i}}", "namespace", "types", "method", "slow",
                                           "args", "ms", 20000),
                                 parent, th_reply, &o),
               0);
  ts_run_until(&w.loop, &o.done, 100);
  cr_assert(!o.done);
  ah__cancel_trip(parent);
  cr_assert(ts_run_until(&w.loop, &o.done, 5000));
  cr_assert_eq(o.status, AH_ECANCELED);
  th_outcome_clear(&o);
  cr_assert_eq(th_unload(&w.loop, w.h, "remote-types"), 0);
  cr_assert_null(ah__host_find_mount(w.h, "remote-types"), "the slow function returned: no zombie");
  rinvoke_err(&w, AH_AUTH_LAN,
              json_pack("{s:s, s:s, s:{s:i}}", "namespace", "types", "method", "echo_int", "args", "i", 1),
              AH_EUNAVAILABLE, "withdrawn");
  ah__cancel_free(parent);
  down(&w);
}

typedef struct seen {
  json_t *names; /* remote.event names in order */
} seen;

static void on_remote_event(const char *name, const json_t *data, void *arg) {
  seen *s = arg;
  if (strcmp(name, "remote.event") == 0)
    json_array_append_new(s->names, json_string(json_string_value(json_object_get(data, "name"))));
}

static bool names_has(json_t *names, const char *n) {
  size_t i = 0;
  json_t *x = NULL;
  json_array_foreach(names, i, x) {
    if (strcmp(json_string_value(x), n) == 0)
      return true;
  }
  return false;
}

static bool saw_closed(void *arg) {
  return names_has(((seen *)arg)->names, "session.closed");
}

/* REMOTE-EVENT-ALLOWLIST / FORWARD: the list declared at mount is the whole list. */
Test(remote, only_allowlisted_events_are_forwarded) {
  rworld w;
  up(&w);
  load_remote_plugin(&w);
  cr_assert_eq(th_load(w.h, "ok", NULL), 0);
  seen s = {json_array()};
  ah_sub *sub = NULL;
  cr_assert_eq(
      ah__host_api(w.h)->subscribe(ah__host_core_mount(w.h), "remote.event", on_remote_event, &s, &sub), 0);
  char *id = create_session(&w, "events");
  ts_outcome o =
      call_as(&w, AH_AUTH_LAN, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", "hello"));
  cr_assert_eq(o.status, 0);
  th_outcome_clear(&o);
  /* ok.ping is allowlisted by its own plugin but not in the remote plugin's list: never forwarded. */
  o = call_as(&w, AH_AUTH_LAN, "ok.emit", json_pack("{s:i}", "n", 1));
  cr_assert_eq(o.status, 0);
  th_outcome_clear(&o);
  o = call_as(&w, AH_AUTH_ADMIN, "session.close", json_pack("{s:s}", "sessionId", id));
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  th_outcome_clear(&o);
  cr_assert(ts_run_until_pred(&w.loop, saw_closed, &s, 10000), "session.closed forwarded");
  cr_assert(names_has(s.names, "session.created"));
  cr_assert(names_has(s.names, "session.event"));
  cr_assert(names_has(s.names, "session.status"));
  cr_assert(!names_has(s.names, "ok.ping"), "a non-allowlisted event was forwarded");
  cr_assert(!names_has(s.names, "session.delta"), "session.delta is transient and not allowlisted");
  size_t i = 0;
  json_t *x = NULL;
  json_array_foreach(s.names, i, x) {
    const char *n = json_string_value(x);
    bool listed = false;
    const char *allow[] = {"session.created",  "session.closed",    "session.status",     "session.event",
                           "subagent.started", "subagent.finished", "request.pending",    "request.resolved",
                           "plugin.mounted",   "plugin.withdrawn",  "host.config-changed"};
    for (size_t k = 0; k < sizeof allow / sizeof allow[0]; k++)
      listed |= strcmp(n, allow[k]) == 0;
    cr_assert(listed, "forwarded %s, which is not allowlisted", n);
  }
  ah__host_api(w.h)->unsubscribe(sub);
  json_decref(s.names);
  free(id);
  down(&w);
}

Test(remote, builtin_session_services) {
  rworld w;
  up(&w);
  load_remote_plugin(&w);
  char *id = create_session(&w, "services");
  json_t *v = rinvoke_ok(&w, AH_AUTH_LAN, "sessions", "rename",
                         json_pack("{s:s, s:s}", "session", id, "title", "new name"));
  json_decref(v);
  v = rinvoke_ok(&w, AH_AUTH_LAN, "sessions", "set_tags",
                 json_pack("{s:s, s:[s,s]}", "session", id, "tags", "a", "b"));
  cr_assert(equal_packed(v, json_pack("[s,s]", "a", "b")));
  json_decref(v);
  rinvoke_err(&w, AH_AUTH_LAN,
              json_pack("{s:s, s:s, s:{s:s, s:[i]}}", "namespace", "sessions", "method", "set_tags", "args",
                        "session", id, "tags", 1),
              AH_EINVAL, NULL);
  /* Tool policy is privileged: forbidden to a LAN caller, allowed from loopback with a token. */
  rinvoke_err(&w, AH_AUTH_LAN,
              json_pack("{s:s, s:s, s:{s:s, s:s, s:s}}", "namespace", "sessions", "method", "tool_policy",
                        "args", "session", id, "tool", "run_command", "policy", "allow"),
              AH_EPERM, NULL);
  v = rinvoke_ok(&w, AH_AUTH_LOOPBACK, "sessions", "tool_policy",
                 json_pack("{s:s, s:s, s:s}", "session", id, "tool", "run_command", "policy", "deny"));
  cr_assert_str_eq(json_string_value(json_object_get(v, "run_command")), "deny");
  json_decref(v);
  rinvoke_err(&w, AH_AUTH_LOOPBACK,
              json_pack("{s:s, s:s, s:{s:s, s:s, s:s}}", "namespace", "sessions", "method", "tool_policy",
                        "args", "session", id, "tool", "no_such_tool", "policy", "allow"),
              AH_EINVAL, NULL);
  ts_outcome o = call_as(&w, AH_AUTH_LAN, "session.get", json_pack("{s:s}", "sessionId", id));
  json_t *row = json_object_get(o.result, "session");
  cr_assert_str_eq(json_string_value(json_object_get(row, "title")), "new name");
  cr_assert(equal_packed(json_object_get(row, "tags"), json_pack("[s,s]", "a", "b")));
  th_outcome_clear(&o);
  /* Pending requests: an approval waits for an answer (run_command asks once its policy is ask). */
  v = rinvoke_ok(&w, AH_AUTH_LOOPBACK, "sessions", "tool_policy",
                 json_pack("{s:s, s:s, s:s}", "session", id, "tool", "run_command", "policy", "ask"));
  json_decref(v);
  o = call_as(&w, AH_AUTH_LAN, "session.prompt",
              json_pack("{s:s, s:s}", "sessionId", id, "text", "/tool run_command {\"command\":\"true\"}"));
  cr_assert_eq(o.status, 0);
  th_outcome_clear(&o);
  json_t *p = NULL;
  for (int i = 0; i < 500; i++) {
    p = rinvoke_ok(&w, AH_AUTH_LAN, "sessions", "pending", json_pack("{s:s}", "session", id));
    if (json_integer_value(json_object_get(p, "approvals")) == 1)
      break;
    json_decref(p);
    p = NULL;
    ts_run_until(&w.loop, &(bool){false}, 10);
  }
  cr_assert_not_null(p, "the approval shows in sessions.pending");
  cr_assert_eq(json_integer_value(json_object_get(p, "questions")), 0);
  cr_assert_str_eq(
      json_string_value(json_object_get(json_array_get(json_object_get(p, "requests"), 0), "tool")),
      "run_command");
  json_decref(p);
  free(id);
  down(&w);
}
