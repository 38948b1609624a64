/* Unit tests for host/registry.c and the dispatch gate in host/calls.c: name validation, privileged
 * methods refused to non-privileged callers, deny by default over the whole method table, and remote
 * descriptor validation — with a valid descriptor's libffi call interface exercised against real C
 * functions of the matching signatures. */
#include <criterion/criterion.h>
#include <ffi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "host_support.h"
#include "internal.h"
#include "support.h"

static void loop_round_trip(void) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  cr_assert_eq(ts_loop_close(&loop), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

/* ---- names ---------------------------------------------------------------------------------------- */

static char *repeat(char c, size_t n) {
  char *s = malloc(n + 1);
  cr_assert_not_null(s);
  memset(s, c, n);
  s[n] = '\0';
  return s;
}

/* Hostile names every dotted-name validator must refuse. */
static const char *const hostile_dotted[] = {
    "",          "ok",       ".ok.echo",    "ok.echo.",   "ok..echo",  "..",         "../ok.echo",
    "ok/../x.y", "Ok.echo",  "ok.Echo",     "OK.ECHO",    "1ok.echo",  "ok.1echo",   "_ok.echo",
    "-ok.echo",  "ok.-echo", "ok.ec ho",    " ok.echo",   "ok.echo ",  "ok.echo\n",  "ok.\necho",
    "ok.\x01x",  "ok.x\x7f", "ok.x\x1b[0m", "ok.\txy",    "ok\\.echo", "ok/echo",    "ok.ech*",
    "ok.*",      "*",        "ok.é",        "ok.ech\xff", "ok:echo",   "ok.echo;rm", "ok.e%s",
};

Test(registry, method_names) {
  const char *good[] = {"ok.echo", "a.b",           "a.b.c",       "a-b.c_d",
                        "x1.y2",   "host.describe", "plugin.load", "ok.some-thing_2"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    cr_expect(ah__valid_method_name(good[i]), "'%s' refused", good[i]);
  for (size_t i = 0; i < sizeof hostile_dotted / sizeof hostile_dotted[0]; i++)
    cr_expect_not(ah__valid_method_name(hostile_dotted[i]), "hostile #%zu '%s' accepted", i,
                  hostile_dotted[i]);
  cr_expect_not(ah__valid_method_name(NULL));

  /* 128 bytes is the limit; 129 is refused. */
  char *n128 = repeat('a', 128);
  n128[3] = '.';
  cr_expect_eq(strlen(n128), 128u);
  cr_expect(ah__valid_method_name(n128), "a 128-byte name refused");
  char *n129 = repeat('a', 129);
  n129[3] = '.';
  cr_expect_not(ah__valid_method_name(n129), "a 129-byte name accepted");
  cr_expect_not(ah__valid_event_name(n129));
  free(n128);
  free(n129);
  loop_round_trip();
}

Test(registry, event_names) {
  const char *good[] = {"ok.ping", "session.created", "host.config-changed", "a.b.c"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    cr_expect(ah__valid_event_name(good[i]), "'%s' refused", good[i]);
  for (size_t i = 0; i < sizeof hostile_dotted / sizeof hostile_dotted[0]; i++)
    cr_expect_not(ah__valid_event_name(hostile_dotted[i]), "hostile #%zu '%s' accepted", i,
                  hostile_dotted[i]);
  cr_expect_not(ah__valid_event_name(NULL));
  loop_round_trip();
}

Test(registry, plugin_names) {
  const char *good[] = {"ok", "a", "a1", "a-b", "a-b-2", "browser", "remote"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    cr_expect(ah__valid_plugin_name(good[i]), "'%s' refused", good[i]);
  char *n32 = repeat('p', 32);
  char *n33 = repeat('p', 33);
  cr_expect(ah__valid_plugin_name(n32), "a 32-byte plugin name refused");
  cr_expect_not(ah__valid_plugin_name(n33), "a 33-byte plugin name accepted");
  free(n32);
  free(n33);
  const char *bad[] = {"",    "Ok",  "OK",    "1ok",   "-ok",  "_ok",     "ok.x",  "..",
                       ".ok", "a_b", "ok/..", "../ok", "ok x", "ok\n",    "o\x01", "ok\x7f",
                       "oké", "ok*", "ok;",   "/ok",   "ok\\", "ok:core", " ok"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_expect_not(ah__valid_plugin_name(bad[i]), "bad #%zu '%s' accepted", i, bad[i]);
  cr_expect_not(ah__valid_plugin_name(NULL));
  loop_round_trip();
}

/* ---- dispatch -------------------------------------------------------------------------------------- */

typedef struct hostctx {
  uv_loop_t loop;
  ah_host *h;
  char *dir; /* a state directory, for a host with sessions */
  ah_config cfg;
} hostctx;

static void host_up(hostctx *c, bool with_ok) {
  memset(c, 0, sizeof *c);
  cr_assert_eq(uv_loop_init(&c->loop), 0);
  c->h = th_host_new(&c->loop, 0);
  cr_assert_not_null(c->h);
  if (with_ok)
    cr_assert_eq(th_load(c->h, "ok", NULL), 0);
}

/* A host with a state directory: the store and the session.* / request.* methods are mounted too. */
static void host_up_with_state(hostctx *c) {
  memset(c, 0, sizeof *c);
  cr_assert_eq(uv_loop_init(&c->loop), 0);
  c->dir = ts_mkdtemp();
  c->cfg.state_dir = c->dir;
  c->cfg.default_provider = "echo";
  ah_host_opts opts = {.loop = &c->loop, .config = &c->cfg, .mode = "serve", .drain_ms = 1000};
  cr_assert_eq(ah__host_new(&opts, &c->h), 0);
  cr_assert_eq(th_load(c->h, "ok", NULL), 0);
}

static void host_down(hostctx *c) {
  cr_assert_eq(th_host_stop_free(&c->loop, c->h), 0);
  if (c->dir) {
    ts_rmtree(c->dir);
    free(c->dir);
  }
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

Test(registry, privileged_core_method_refused_to_lan) {
  hostctx c;
  host_up(&c, false);
  ts_outcome o;
  /* The params are stolen also on refusal (LeakSanitizer). */
  cr_expect_eq(
      th_call(&c.loop, c.h, AH_AUTH_LAN, "plugin.load", json_pack("{s:s}", "path", "/nonexistent.so"), &o),
      AH_EPERM);
  cr_expect_not(o.done, "a refused dispatch must not call back");
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "plugin.unload", json_pack("{s:s}", "name", "core"), &o),
               AH_EPERM);
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "plugin.reload", json_object(), &o), AH_EPERM);

  /* Privileged callers get through to the method, which refuses the bad params itself. */
  const ah_authority privileged[] = {AH_AUTH_LOOPBACK, AH_AUTH_STDIO_OWNER, AH_AUTH_ADMIN};
  for (size_t i = 0; i < 3; i++) {
    cr_assert_eq(th_call(&c.loop, c.h, privileged[i], "plugin.load", json_object(), &o), 0, "authority %d",
                 privileged[i]);
    cr_expect(o.done);
    cr_expect_eq(o.status, AH_EINVAL, "authority %d: status %d", privileged[i], o.status);
    cr_expect_not_null(o.message);
    th_outcome_clear(&o);
  }
  cr_assert_eq(
      th_call(&c.loop, c.h, AH_AUTH_ADMIN, "plugin.load", json_pack("{s:s}", "path", "relative.so"), &o), 0);
  cr_expect_eq(o.status, AH_EINVAL);
  th_outcome_clear(&o);
  host_down(&c);
}

Test(registry, privileged_plugin_method_by_authority) {
  hostctx c;
  host_up(&c, true);
  ts_outcome o;
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "ok.admin", NULL, &o), AH_EPERM);
  cr_expect_not(o.done);
  const ah_authority privileged[] = {AH_AUTH_LOOPBACK, AH_AUTH_STDIO_OWNER, AH_AUTH_ADMIN};
  for (size_t i = 0; i < 3; i++) {
    cr_assert_eq(th_call(&c.loop, c.h, privileged[i], "ok.admin", NULL, &o), 0, "authority %d",
                 privileged[i]);
    cr_assert(o.done);
    cr_expect_eq(o.status, 0);
    cr_expect(json_is_true(json_object_get(o.result, "ok")));
    th_outcome_clear(&o);
  }
  /* A public method of the same plugin is open to LAN callers. */
  cr_assert_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "ok.add", json_pack("{s:i, s:i}", "a", 2, "b", 40), &o), 0);
  cr_expect_eq(o.status, 0);
  cr_expect_eq(json_integer_value(json_object_get(o.result, "sum")), 42);
  th_outcome_clear(&o);
  host_down(&c);
}

/* The only methods that may be public. Adding a public method means adding it here, on purpose. */
/* Every public method, by name: a method that becomes public by accident fails the test. */
static const char *const public_allowlist[] = {
    "host.describe",   "plugin.list",    "ok.echo",        "ok.add",          "ok.emit",
    "session.create",  "session.list",   "session.get",    "session.history", "session.prompt",
    "session.cancel",  "session.close",  "session.export", "session.tools",   "request.list",
    "request.respond", "session.events", "provider.list",  "session.options"};

static bool allowlisted(const char *name) {
  for (size_t i = 0; i < sizeof public_allowlist / sizeof public_allowlist[0]; i++)
    if (strcmp(name, public_allowlist[i]) == 0)
      return true;
  return false;
}

Test(registry, deny_by_default_method_table) {
  hostctx c;
  host_up_with_state(&c);
  ts_outcome o;
  cr_assert_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "host.describe", NULL, &o), 0);
  cr_assert_eq(o.status, 0);
  json_t *plugins = json_object_get(o.result, "plugins");
  cr_assert(json_is_array(plugins));
  size_t nmethods = 0, npublic = 0, nprivileged = 0;
  bool saw_core = false, saw_ok = false;
  size_t i = 0;
  json_t *p = NULL;
  json_array_foreach(plugins, i, p) {
    const char *pname = json_string_value(json_object_get(p, "name"));
    saw_core |= pname && strcmp(pname, "core") == 0;
    saw_ok |= pname && strcmp(pname, "ok") == 0;
    size_t j = 0;
    json_t *m = NULL;
    json_array_foreach(json_object_get(p, "methods"), j, m) {
      const char *name = json_string_value(json_object_get(m, "name"));
      json_t *priv = json_object_get(m, "privileged");
      cr_assert_not_null(name);
      cr_assert(json_is_boolean(priv), "%s: privileged missing", name);
      nmethods++;
      if (json_is_true(priv)) {
        nprivileged++;
        /* Described as privileged, and the dispatch gate agrees. */
        ts_outcome r;
        cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, name, json_object(), &r), AH_EPERM,
                     "privileged %s was dispatched for a LAN caller", name);
        if (r.done)
          th_outcome_clear(&r);
      } else {
        npublic++;
        cr_expect(allowlisted(name), "method %s (plugin %s) is public but not in the test's allowlist", name,
                  pname);
      }
    }
  }
  cr_expect(saw_core && saw_ok);
  /* The allowlist is exact: every entry exists and is public. */
  cr_expect_eq(npublic, sizeof public_allowlist / sizeof public_allowlist[0]);
  cr_expect_geq(nprivileged, 6u, "plugin.load/unload/reload, session.delete, session.set-policy, ok.admin");
  cr_expect_eq(nmethods, npublic + nprivileged);
  th_outcome_clear(&o);
  host_down(&c);
}

Test(registry, unknown_and_withdrawn_methods) {
  hostctx c;
  host_up(&c, true);
  ts_outcome o;
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_ADMIN, "nope.nothing", json_object(), &o), AH_ENOMETHOD);
  cr_expect_not(o.done);
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_ADMIN, "ok.ping", NULL, &o), AH_ENOMETHOD,
               "an event is no method");
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_ADMIN, "ok.greet", NULL, &o), AH_ENOMETHOD,
               "a remote descriptor is no method");
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_ADMIN, "", NULL, &o), AH_ENOMETHOD);
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_ADMIN, "OK.ECHO", NULL, &o), AH_ENOMETHOD);
  /* Fail closed after withdraw: unavailable, never "no such method" and never another entry. */
  cr_assert_eq(th_unload(&c.loop, c.h, "ok"), 0);
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_ADMIN, "ok.echo", NULL, &o), AH_EUNAVAILABLE);
  cr_expect_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "ok.admin", NULL, &o), AH_EUNAVAILABLE);
  host_down(&c);
}

Test(registry, dispatch_bad_caller_refused) {
  hostctx c;
  host_up(&c, false);
  ts_outcome o = {0};
  ah_caller good = {.struct_size = sizeof good, .authority = AH_AUTH_ADMIN, .surface = "test"};
  ah_caller zero_size = good;
  zero_size.struct_size = 0;
  ah_caller short_size = good;
  short_size.struct_size = offsetof(ah_caller, connection_id);
  ah_caller invalid = good;
  invalid.authority = AH_AUTH_INVALID;
  ah_caller beyond = good;
  beyond.authority = (ah_authority)(AH_AUTH_ADMIN + 1);
  const ah_caller *bad[] = {&zero_size, &short_size, &invalid, &beyond, NULL};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_expect_eq(ah__host_dispatch(c.h, bad[i], "host.describe", json_object(), NULL, th_reply, &o),
                 AH_EINVAL, "bad caller #%zu", i);
  cr_expect_eq(ah__host_dispatch(c.h, &good, NULL, json_object(), NULL, th_reply, &o), AH_EINVAL,
               "NULL method");
  cr_expect_eq(ah__host_dispatch(c.h, &good, "host.describe", json_object(), NULL, NULL, &o), AH_EINVAL,
               "NULL callback");
  cr_expect_eq(ah__host_dispatch(c.h, &good, "host.describe", json_string("x"), NULL, th_reply, &o),
               AH_EINVAL, "params neither object nor array");
  cr_expect_eq(ah__host_dispatch(c.h, &good, "host.describe", json_integer(3), NULL, th_reply, &o),
               AH_EINVAL);
  for (int i = 0; i < 10; i++)
    uv_run(&c.loop, UV_RUN_NOWAIT);
  cr_expect_not(o.done, "a refused dispatch called back");
  /* The good caller works. */
  cr_assert_eq(ah__host_dispatch(c.h, &good, "host.describe", NULL, NULL, th_reply, &o), 0);
  cr_expect_not(o.done, "the outcome must arrive on a later loop turn");
  cr_assert(ts_run_until(&c.loop, &o.done, 5000));
  cr_expect_eq(o.status, 0);
  th_outcome_clear(&o);
  host_down(&c);
}

/* ---- remote descriptors ------------------------------------------------------------------------- */

static int fn_placeholder(ah_call *call) {
  (void)call;
  return 0;
}

/* A mount that is never mounted: enough for ah__remote_prepare (it reads name and path for its logs). */
static ah_mount *fake_mount(void) {
  ah_mount *m = calloc(1, sizeof *m);
  cr_assert_not_null(m);
  m->name = strdup("fake");
  m->path = strdup("/nowhere/fake.so");
  return m;
}

static void fake_mount_free(ah_mount *m) {
  free(m->name);
  free(m->path);
  free(m);
}

static ah_remote_def base_def(const ah_remote_param *params, size_t n) {
  ah_remote_def d = {
      .struct_size = sizeof d,
      .ns = "fake",
      .method = "doIt",
      .params = params,
      .nparams = n,
      .result = AH_TYPE_STRING,
      .result_optional = false,
      .flags = 0,
      .lookup = AH_LOOKUP_NONE,
      .fn = AH_REMOTE_FN(fn_placeholder),
  };
  return d;
}

static void expect_refused(ah_mount *m, const ah_remote_def *d, const char *what) {
  ah__remote *r = (ah__remote *)(uintptr_t)0x1;
  cr_expect_eq(ah__remote_prepare(m, d, &r), AH_EINVAL, "%s accepted", what);
  cr_expect_eq(r, (ah__remote *)(uintptr_t)0x1, "%s: *out was written on refusal", what);
}

Test(registry, remote_descriptor_refusals) {
  ah_mount *m = fake_mount();
  const ah_remote_param one[] = {{.name = "text", .type = AH_TYPE_STRING}};
  ah_remote_def d;

  /* The baseline is accepted, so every refusal below is due to its one change. */
  d = base_def(one, 1);
  ah__remote *ok = NULL;
  cr_assert_eq(ah__remote_prepare(m, &d, &ok), 0);
  ah__remote_free(ok);

  const char *bad_ns[] = {"", "Fake", "1fake", "fa ke", "fa.ke", "_fake", "fake/x", "fa\nke", "faKe"};
  for (size_t i = 0; i < sizeof bad_ns / sizeof bad_ns[0]; i++) {
    d = base_def(one, 1);
    d.ns = bad_ns[i];
    char what[64];
    snprintf(what, sizeof what, "ns '%s'", bad_ns[i]);
    expect_refused(m, &d, what);
  }
  d = base_def(one, 1);
  d.ns = NULL;
  expect_refused(m, &d, "NULL ns");

  const char *bad_method[] = {"", "DoIt", "1do", "do-it", "do.it", "do it", "_do", "do\x01"};
  for (size_t i = 0; i < sizeof bad_method / sizeof bad_method[0]; i++) {
    d = base_def(one, 1);
    d.method = bad_method[i];
    char what[64];
    snprintf(what, sizeof what, "method '%s'", bad_method[i]);
    expect_refused(m, &d, what);
  }
  d = base_def(one, 1);
  d.method = NULL;
  expect_refused(m, &d, "NULL method");

  d = base_def(one, 1);
  d.struct_size = 8;
  expect_refused(m, &d, "a short struct_size");
  d = base_def(one, 1);
  d.fn = NULL;
  expect_refused(m, &d, "a missing fn");
  d = base_def(one, 1);
  d.flags = 1u << 7;
  expect_refused(m, &d, "unknown flags");
  d = base_def(NULL, 1);
  expect_refused(m, &d, "nparams without params");

  const ah_remote_param dup[] = {{.name = "a", .type = AH_TYPE_STRING}, {.name = "a", .type = AH_TYPE_INT64}};
  d = base_def(dup, 2);
  expect_refused(m, &d, "duplicate parameter names");

  const ah_remote_param badname[] = {{.name = "Text", .type = AH_TYPE_STRING}};
  d = base_def(badname, 1);
  expect_refused(m, &d, "a parameter name with a capital first letter");
  const ah_remote_param nullname[] = {{.name = NULL, .type = AH_TYPE_STRING}};
  d = base_def(nullname, 1);
  expect_refused(m, &d, "a NULL parameter name");
  const ah_remote_param voidparam[] = {{.name = "v", .type = AH_TYPE_VOID}};
  d = base_def(voidparam, 1);
  expect_refused(m, &d, "a void parameter");
  const ah_remote_param invparam[] = {{.name = "v", .type = (ah_type)99}};
  d = base_def(invparam, 1);
  expect_refused(m, &d, "an unknown parameter type");

  const ah_remote_param session_second[] = {{.name = "text", .type = AH_TYPE_STRING},
                                            {.name = "session", .type = AH_TYPE_SESSION}};
  d = base_def(session_second, 2);
  d.lookup = AH_LOOKUP_SESSION;
  expect_refused(m, &d, "a session parameter that is not first");

  const ah_remote_param session_first[] = {{.name = "session", .type = AH_TYPE_SESSION},
                                           {.name = "text", .type = AH_TYPE_STRING}};
  d = base_def(session_first, 2);
  d.lookup = AH_LOOKUP_AGENT;
  expect_refused(m, &d, "lookup AGENT with a session parameter");
  d = base_def(session_first, 2);
  d.lookup = AH_LOOKUP_NONE;
  expect_refused(m, &d, "lookup NONE with a session parameter");
  d = base_def(one, 1);
  d.lookup = AH_LOOKUP_SESSION;
  expect_refused(m, &d, "lookup SESSION without a session parameter");
  d = base_def(NULL, 0);
  d.lookup = AH_LOOKUP_AGENT;
  expect_refused(m, &d, "lookup AGENT without parameters");
  d = base_def(session_first, 2);
  d.lookup = AH_LOOKUP_INVALID;
  expect_refused(m, &d, "lookup INVALID");
  const ah_remote_param opt_session[] = {{.name = "session", .type = AH_TYPE_SESSION, .optional = true}};
  d = base_def(opt_session, 1);
  d.lookup = AH_LOOKUP_SESSION;
  expect_refused(m, &d, "an optional session parameter");

  ah_remote_param many[17];
  char names[17][8];
  for (int i = 0; i < 17; i++) {
    snprintf(names[i], sizeof names[i], "p%d", i);
    many[i] = (ah_remote_param){.name = names[i], .type = AH_TYPE_INT64};
  }
  d = base_def(many, 17);
  expect_refused(m, &d, "17 parameters");
  d = base_def(many, 16);
  ah__remote *r16 = NULL;
  cr_expect_eq(ah__remote_prepare(m, &d, &r16), 0, "16 parameters are allowed");
  if (r16)
    cr_expect_eq(r16->nargs, 18u);
  ah__remote_free(r16);

  const ah_type not_optional[] = {AH_TYPE_BOOL, AH_TYPE_INT64, AH_TYPE_DOUBLE, AH_TYPE_VOID};
  for (size_t i = 0; i < sizeof not_optional / sizeof not_optional[0]; i++) {
    d = base_def(one, 1);
    d.result = not_optional[i];
    d.result_optional = true;
    char what[64];
    snprintf(what, sizeof what, "an optional %s result", ah__type_name(not_optional[i]));
    expect_refused(m, &d, what);
  }
  const ah_type bad_results[] = {AH_TYPE_INVALID, AH_TYPE_SESSION, AH_TYPE_AGENT, (ah_type)42};
  for (size_t i = 0; i < sizeof bad_results / sizeof bad_results[0]; i++) {
    d = base_def(one, 1);
    d.result = bad_results[i];
    char what[64];
    snprintf(what, sizeof what, "result type %d", (int)bad_results[i]);
    expect_refused(m, &d, what);
  }
  fake_mount_free(m);
  loop_round_trip();
}

/* ---- the call interface matches the C signature ------------------------------------------------- */

static ah_call *const CALL_SENTINEL = (ah_call *)(uintptr_t)0xC0FFEE0;

static int fn_format(ah_call *call, const char *s, int64_t n, double d, bool b, char **out) {
  if (call != CALL_SENTINEL || !out)
    return AH_EINTERNAL;
  if (n < 0)
    return AH_EINVAL; /* a negative return must survive libffi's widening */
  char *text = NULL;
  if (asprintf(&text, "%s|%lld|%.3f|%s", s, (long long)n, d, b ? "true" : "false") < 0)
    return AH_ENOMEM;
  *out = text;
  return 0;
}

static int fn_optionals(ah_call *call, const int64_t *n, const double *d, const bool *b, const char *s,
                        bool *out) {
  if (call != CALL_SENTINEL)
    return AH_EINTERNAL;
  /* true when every optional is present with its expected value; false when all are absent. */
  if (n && d && b && s) {
    *out = *n == INT64_MIN && *d == -0.5 && *b && strcmp(s, "x") == 0;
    return 0;
  }
  if (!n && !d && !b) {
    *out = false;
    return 1; /* a positive value, distinguishable from 0 */
  }
  return AH_EINVAL;
}

static int fn_void(ah_call *call, void *session, json_t *j) {
  if (call != CALL_SENTINEL || session != (void *)CALL_SENTINEL)
    return AH_EINTERNAL;
  return json_integer_value(json_object_get(j, "rc")) == -8 ? AH_ECANCELED : 0;
}

/* ffi_call with a return value widened to ffi_arg, read back as the C function's int. */
static int call_remote(ah__remote *r, void **values) {
  ffi_arg rc = 0;
  ffi_call(&r->cif, FFI_FN(r->fn), &rc, values);
  return (int)(ffi_sarg)rc;
}

Test(registry, remote_cif_matches_c_signature) {
  ah_mount *m = fake_mount();
  const ah_remote_param params[] = {{.name = "s", .type = AH_TYPE_STRING},
                                    {.name = "n", .type = AH_TYPE_INT64},
                                    {.name = "d", .type = AH_TYPE_DOUBLE},
                                    {.name = "b", .type = AH_TYPE_BOOL}};
  ah_remote_def d = base_def(params, 4);
  d.fn = AH_REMOTE_FN(fn_format);
  ah__remote *r = NULL;
  cr_assert_eq(ah__remote_prepare(m, &d, &r), 0);
  cr_expect_str_eq(r->ns, "fake");
  cr_expect_str_eq(r->method, "doIt");
  cr_assert_eq(r->nargs, 6u, "call + 4 params + out");
  cr_expect_eq(r->cif.nargs, 6u);
  cr_expect_eq(r->cif.rtype, &ffi_type_sint);
  cr_expect_eq(r->arg_types[0], &ffi_type_pointer);
  cr_expect_eq(r->arg_types[1], &ffi_type_pointer);
  cr_expect_eq(r->arg_types[2], &ffi_type_sint64);
  cr_expect_eq(r->arg_types[3], &ffi_type_double);
  cr_expect_eq(r->arg_types[5], &ffi_type_pointer);
  cr_expect_eq(r->arg_types[4]->size, sizeof(bool));
  /* The host copied the names: the definition's storage is not referenced. */
  cr_expect_neq(r->params[0].name, params[0].name);
  cr_expect_str_eq(r->params[3].name, "b");

  ah_call *call = CALL_SENTINEL;
  const char *s = "héllo";
  int64_t n = INT64_C(9007199254740993); /* not representable as a double */
  double dv = 2.5;
  bool bv = true;
  char *out = NULL;
  char **outp = &out;
  void *values[6] = {&call, &s, &n, &dv, &bv, &outp};
  cr_assert_eq(call_remote(r, values), 0);
  cr_assert_not_null(out);
  cr_expect_str_eq(out, "héllo|9007199254740993|2.500|true");
  free(out);

  out = NULL;
  bv = false;
  n = 0;
  dv = -0.125;
  cr_assert_eq(call_remote(r, values), 0);
  cr_expect_str_eq(out, "h\xc3\xa9llo|0|-0.125|false");
  free(out);

  n = -1;
  out = NULL;
  cr_expect_eq(call_remote(r, values), AH_EINVAL, "a negative int return was not sign-extended");
  cr_expect_null(out);
  ah__remote_free(r);

  /* Optional parameters are pointers (NULL when absent); a bool result is written through bool *. */
  const ah_remote_param opt[] = {{.name = "n", .type = AH_TYPE_INT64, .optional = true},
                                 {.name = "d", .type = AH_TYPE_DOUBLE, .optional = true},
                                 {.name = "b", .type = AH_TYPE_BOOL, .optional = true},
                                 {.name = "s", .type = AH_TYPE_STRING, .optional = true}};
  d = base_def(opt, 4);
  d.result = AH_TYPE_BOOL;
  d.fn = AH_REMOTE_FN(fn_optionals);
  cr_assert_eq(ah__remote_prepare(m, &d, &r), 0);
  cr_assert_eq(r->nargs, 6u);
  for (unsigned i = 0; i < r->nargs; i++)
    cr_expect_eq(r->arg_types[i], &ffi_type_pointer, "argument %u is not a pointer", i);
  int64_t on = INT64_MIN;
  double od = -0.5;
  bool ob = true;
  const char *os = "x";
  const int64_t *pn = &on;
  const double *pd = &od;
  const bool *pb = &ob;
  /* The result slot is preset to a non-bool byte pattern: the function must store a whole bool. */
  union {
    bool b;
    unsigned char raw;
  } res = {.raw = 0xAA};
  bool *pres = &res.b;
  void *ovalues[6] = {&call, &pn, &pd, &pb, &os, &pres};
  cr_assert_eq(call_remote(r, ovalues), 0);
  cr_expect_eq(res.raw, 1, "the bool result is %u", res.raw);
  const int64_t *nn = NULL;
  const double *nd = NULL;
  const bool *nb = NULL;
  const char *ns = NULL;
  res.raw = 0xAA;
  void *nvalues[6] = {&call, &nn, &nd, &nb, &ns, &pres};
  cr_expect_eq(call_remote(r, nvalues), 1);
  cr_expect_eq(res.raw, 0);
  ah__remote_free(r);

  /* A void result has no out parameter; a session lookup passes the session as a pointer first. */
  const ah_remote_param sess[] = {{.name = "session", .type = AH_TYPE_SESSION},
                                  {.name = "j", .type = AH_TYPE_JSON}};
  d = base_def(sess, 2);
  d.lookup = AH_LOOKUP_SESSION;
  d.result = AH_TYPE_VOID;
  d.flags = AH_REMOTE_CANCELLABLE | AH_REMOTE_PRIVILEGED;
  d.fn = AH_REMOTE_FN(fn_void);
  cr_assert_eq(ah__remote_prepare(m, &d, &r), 0);
  cr_expect_eq(r->nargs, 3u);
  cr_expect_eq(r->lookup, AH_LOOKUP_SESSION);
  cr_expect_eq(r->flags, (uint32_t)(AH_REMOTE_CANCELLABLE | AH_REMOTE_PRIVILEGED));
  void *session = (void *)CALL_SENTINEL;
  json_t *j = json_pack("{s:i}", "rc", -8);
  void *vvalues[3] = {&call, &session, &j};
  cr_expect_eq(call_remote(r, vvalues), AH_ECANCELED);
  json_object_set_new(j, "rc", json_integer(0));
  cr_expect_eq(call_remote(r, vvalues), 0);
  json_decref(j);
  ah__remote_free(r);

  fake_mount_free(m);
  loop_round_trip();
}

/* REMOTE-EVENT-ALLOWLIST: the core declares exactly eleven allowlisted events; its others (tools.changed,
 * session.updated, session.options, session.deleted) are declared without the flag. */
Test(registry, the_core_allowlists_exactly_its_eleven_events) {
  hostctx c;
  host_up_with_state(&c);
  ts_outcome o;
  cr_assert_eq(th_call(&c.loop, c.h, AH_AUTH_LAN, "host.describe", NULL, &o), 0);
  static const char *const want[] = {"session.created",  "session.closed",     "session.status",
                                     "session.event",    "subagent.started",   "subagent.finished",
                                     "request.pending",  "request.resolved",   "plugin.mounted",
                                     "plugin.withdrawn", "host.config-changed"};
  size_t listed = 0, unlisted = 0, i = 0;
  json_t *p = NULL;
  json_array_foreach(json_object_get(o.result, "plugins"), i, p) {
    if (strcmp(json_string_value(json_object_get(p, "name")), "core") != 0)
      continue;
    size_t j = 0;
    json_t *e = NULL;
    json_array_foreach(json_object_get(p, "events"), j, e) {
      const char *name = json_string_value(json_object_get(e, "name"));
      bool in = false;
      for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        in = in || strcmp(want[k], name) == 0;
      cr_expect_eq(json_is_true(json_object_get(e, "allowlisted")), in, "%s", name);
      listed += in;
      unlisted += !in;
    }
  }
  cr_expect_eq(listed, sizeof want / sizeof want[0]);
  cr_expect_geq(unlisted, 4u, "tools.changed, session.updated, session.options, session.deleted");
  th_outcome_clear(&o);
  host_down(&c);
}
