/* Fixture "remote-types": remote descriptors of every parameter and result type, lookups, failures and a
 * cancellable slow one, for the gateway tests (tests/unit/test_remote.c). Namespace "types".
 *
 *   echo_bool(b: bool) → bool            echo_int(i: int64) → int64       echo_double(d: double) → double
 *   echo_string(s: string) → string      echo_json(j: json) → json        nothing() → void
 *   optionals(b?, i?, d?, s?, j?) → json {b, i, d, s, j: the value or "absent"}
 *   maybe_string(give: bool) → string?   (null unless give)
 *   title(session: session) → string     (the session's title; session lookup)
 *   agent_id(agent: agent) → string      (the session id; agent lookup)
 *   rename(session: session, title: string) → void (api->session_update)
 *   fail(code: int64) → void             returns `code`
 *   bad_bool() → bool (writes 7)   nan() → double (NaN)   null_string() → string (NULL, not optional)
 *   bad_utf8() → string (invalid UTF-8)
 *   token() → bool      (not cancellable: true when a token was given — must be false)
 *   token_c() → bool    (cancellable: true when a token was given — must be true)
 *   slow(ms: int64) → bool   cancellable, long (thread pool): true after `ms`, AH_ECANCELED when its
 *                             token trips first (polled every millisecond)
 *   admin() → bool      privileged
 */
#include <agenthost/plugin.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Descriptor functions get only the call: the host API comes from its head (AH_CALL_API). */
#define rt_api AH_CALL_API(c)

static int rt_echo_bool(ah_call *c, bool b, bool *out) {
  (void)c;
  *out = b;
  return 0;
}
static int rt_echo_int(ah_call *c, int64_t i, int64_t *out) {
  (void)c;
  *out = i;
  return 0;
}
static int rt_echo_double(ah_call *c, double d, double *out) {
  (void)c;
  *out = d;
  return 0;
}
static int rt_echo_string(ah_call *c, const char *s, char **out) {
  (void)c;
  *out = strdup(s);
  return *out ? 0 : AH_ENOMEM;
}
static int rt_echo_json(ah_call *c, json_t *j, json_t **out) {
  (void)c;
  *out = json_deep_copy(j);
  return *out ? 0 : AH_ENOMEM;
}
static int rt_nothing(ah_call *c) {
  (void)c;
  return 0;
}
static int rt_optionals(ah_call *c, const bool *b, const int64_t *i, const double *d, const char *s,
                        json_t *j, json_t **out) {
  (void)c;
  *out = json_pack("{s:o, s:o, s:o, s:o, s:o}", "b", b ? json_boolean(*b) : json_string("absent"), "i",
                   i ? json_integer(*i) : json_string("absent"), "d",
                   d ? json_real(*d) : json_string("absent"), "s", s ? json_string(s) : json_string("absent"),
                   "j", j ? json_deep_copy(j) : json_string("absent"));
  return *out ? 0 : AH_ENOMEM;
}
static int rt_maybe_string(ah_call *c, bool give, char **out) {
  (void)c;
  *out = give ? strdup("given") : NULL;
  return 0;
}
static int rt_title(ah_call *c, ah_session *s, char **out) {
  (void)c;
  json_t *info = rt_api->session_info(s);
  const char *t = json_string_value(json_object_get(info, "title"));
  *out = strdup(t ? t : "");
  json_decref(info);
  return *out ? 0 : AH_ENOMEM;
}
static int rt_agent_id(ah_call *c, ah_session *s, char **out) {
  (void)c;
  *out = strdup(rt_api->session_id(s));
  return *out ? 0 : AH_ENOMEM;
}
static int rt_rename(ah_call *c, ah_session *s, const char *title) {
  (void)c;
  json_t *f = json_pack("{s:s}", "title", title);
  int rc = rt_api->session_update(s, f);
  json_decref(f);
  return rc;
}
static int rt_fail(ah_call *c, int64_t code) {
  (void)c;
  return (int)code;
}
static int rt_bad_bool(ah_call *c, bool *out) {
  (void)c;
  unsigned char seven = 7;
  memcpy(out, &seven, 1);
  return 0;
}
static int rt_nan(ah_call *c, double *out) {
  (void)c;
  *out = NAN;
  return 0;
}
static int rt_null_string(ah_call *c, char **out) {
  (void)c;
  *out = NULL;
  return 0;
}
static int rt_bad_utf8(ah_call *c, char **out) {
  (void)c;
  *out = strdup("caf\xc3");
  return *out ? 0 : AH_ENOMEM;
}
static int rt_token(ah_call *c, bool *out) {
  *out = rt_api->call_cancel_token(c) != NULL;
  return 0;
}
static int rt_slow(ah_call *c, int64_t ms, bool *out) {
  ah_cancel *tok = rt_api->call_cancel_token(c);
  for (int64_t i = 0; i < ms; i++) {
    if (tok && rt_api->token_tripped(tok))
      return AH_ECANCELED;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  *out = true;
  return 0;
}
static int rt_admin(ah_call *c, bool *out) {
  (void)c;
  *out = true;
  return 0;
}

#define P(n, t) \
  { .name = n, .type = t, .optional = false }
#define O(n, t) \
  { .name = n, .type = t, .optional = true }

static const ah_remote_param p_b[] = {P("b", AH_TYPE_BOOL)};
static const ah_remote_param p_i[] = {P("i", AH_TYPE_INT64)};
static const ah_remote_param p_d[] = {P("d", AH_TYPE_DOUBLE)};
static const ah_remote_param p_s[] = {P("s", AH_TYPE_STRING)};
static const ah_remote_param p_j[] = {P("j", AH_TYPE_JSON)};
static const ah_remote_param p_opt[] = {O("b", AH_TYPE_BOOL), O("i", AH_TYPE_INT64), O("d", AH_TYPE_DOUBLE),
                                        O("s", AH_TYPE_STRING), O("j", AH_TYPE_JSON)};
static const ah_remote_param p_give[] = {P("give", AH_TYPE_BOOL)};
static const ah_remote_param p_sess[] = {P("session", AH_TYPE_SESSION)};
static const ah_remote_param p_agent[] = {P("agent", AH_TYPE_AGENT)};
static const ah_remote_param p_rename[] = {P("session", AH_TYPE_SESSION), P("title", AH_TYPE_STRING)};
static const ah_remote_param p_code[] = {P("code", AH_TYPE_INT64)};
static const ah_remote_param p_ms[] = {P("ms", AH_TYPE_INT64)};

#define D(m, ps, n, res, opt, fl, lk, f)                                                                     \
  {                                                                                                          \
    .struct_size = sizeof(ah_remote_def), .param_size = sizeof(ah_remote_param), .ns = "types", .method = m, \
    .params = ps, .nparams = n, .result = res, .result_optional = opt, .flags = fl, .lookup = lk,            \
    .fn = AH_REMOTE_FN(f)                                                                                    \
  }

static const ah_remote_def rt_defs[] = {
    D("echo_bool", p_b, 1, AH_TYPE_BOOL, false, 0, AH_LOOKUP_NONE, rt_echo_bool),
    D("echo_int", p_i, 1, AH_TYPE_INT64, false, 0, AH_LOOKUP_NONE, rt_echo_int),
    D("echo_double", p_d, 1, AH_TYPE_DOUBLE, false, 0, AH_LOOKUP_NONE, rt_echo_double),
    D("echo_string", p_s, 1, AH_TYPE_STRING, false, 0, AH_LOOKUP_NONE, rt_echo_string),
    D("echo_json", p_j, 1, AH_TYPE_JSON, false, 0, AH_LOOKUP_NONE, rt_echo_json),
    D("nothing", NULL, 0, AH_TYPE_VOID, false, 0, AH_LOOKUP_NONE, rt_nothing),
    D("optionals", p_opt, 5, AH_TYPE_JSON, false, 0, AH_LOOKUP_NONE, rt_optionals),
    D("maybe_string", p_give, 1, AH_TYPE_STRING, true, 0, AH_LOOKUP_NONE, rt_maybe_string),
    D("title", p_sess, 1, AH_TYPE_STRING, false, 0, AH_LOOKUP_SESSION, rt_title),
    D("agent_id", p_agent, 1, AH_TYPE_STRING, false, 0, AH_LOOKUP_AGENT, rt_agent_id),
    D("rename", p_rename, 2, AH_TYPE_VOID, false, 0, AH_LOOKUP_SESSION, rt_rename),
    D("fail", p_code, 1, AH_TYPE_VOID, false, 0, AH_LOOKUP_NONE, rt_fail),
    D("bad_bool", NULL, 0, AH_TYPE_BOOL, false, 0, AH_LOOKUP_NONE, rt_bad_bool),
    D("nan", NULL, 0, AH_TYPE_DOUBLE, false, 0, AH_LOOKUP_NONE, rt_nan),
    D("null_string", NULL, 0, AH_TYPE_STRING, false, 0, AH_LOOKUP_NONE, rt_null_string),
    D("bad_utf8", NULL, 0, AH_TYPE_STRING, false, 0, AH_LOOKUP_NONE, rt_bad_utf8),
    D("token", NULL, 0, AH_TYPE_BOOL, false, 0, AH_LOOKUP_NONE, rt_token),
    D("token_c", NULL, 0, AH_TYPE_BOOL, false, AH_REMOTE_CANCELLABLE, AH_LOOKUP_NONE, rt_token),
    D("slow", p_ms, 1, AH_TYPE_BOOL, false, AH_REMOTE_CANCELLABLE | AH_REMOTE_LONG, AH_LOOKUP_NONE, rt_slow),
    D("admin", NULL, 0, AH_TYPE_BOOL, false, AH_REMOTE_PRIVILEGED, AH_LOOKUP_NONE, rt_admin),
};

static int rt_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  (void)state;
  if (!AH_HAS_FIELD(api, ah_host_api, session_update))
    return AH_EINVAL;
  for (size_t i = 0; i < sizeof rt_defs / sizeof rt_defs[0]; i++)
    api->register_remote(m, &rt_defs[i]);
  return 0;
}

static const ah_plugin_desc rt_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "remote-types",
    .version = "1.0.0",
    .description = "test fixture: remote descriptors of every type",
    .mount = rt_mount,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &rt_desc;
}
