/* Fixture "ok": a well-behaved plugin that exercises every kind of registration.
 *
 * Methods: ok.echo (public; replies with its params), ok.add (public; {a, b} → {sum}), ok.admin
 * (privileged; {"ok": true}), ok.emit (public; emits ok.ping with its params, replies {}).
 * Events: ok.ping (allowlisted), ok.internal (not allowlisted).
 * Remote descriptor: ok.greet(name: string) → string "hello, <name>".
 *
 * All state lives behind the state pointer; the descriptor is the only static object.
 */
#include <agenthost/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ok_state {
  ah_mount *m;
  const ah_host_api *api;
} ok_state;

/* Answer `call` with `result` (stolen); a NULL result means the reply could not be built. */
static void ok_reply(ok_state *st, ah_call *call, json_t *result) {
  if (result == NULL) {
    st->api->call_error(call, AH_ENOMEM, "cannot build the reply", NULL);
    return;
  }
  st->api->call_reply(call, result);
}

static void ok_echo(ah_call *call, const json_t *params, void *data) {
  ok_state *st = data;
  ok_reply(st, call, json_deep_copy(params));
}

static void ok_add(ah_call *call, const json_t *params, void *data) {
  ok_state *st = data;
  const json_t *a = json_object_get(params, "a");
  const json_t *b = json_object_get(params, "b");
  json_int_t sum = 0;

  if (!json_is_integer(a) || !json_is_integer(b)) {
    st->api->call_error(call, AH_EINVAL, "params must be {a: integer, b: integer}", NULL);
    return;
  }
  if (__builtin_add_overflow(json_integer_value(a), json_integer_value(b), &sum)) {
    st->api->call_error(call, AH_EINVAL, "a + b overflows", NULL);
    return;
  }
  ok_reply(st, call, json_pack("{s:I}", "sum", sum));
}

static void ok_admin(ah_call *call, const json_t *params, void *data) {
  ok_state *st = data;
  (void)params;
  ok_reply(st, call, json_pack("{s:b}", "ok", 1));
}

static void ok_emit(ah_call *call, const json_t *params, void *data) {
  ok_state *st = data;
  json_t *event = json_deep_copy(params);
  int rc = 0;

  if (event == NULL) {
    st->api->call_error(call, AH_ENOMEM, "cannot copy the params", NULL);
    return;
  }
  rc = st->api->emit(st->m, "ok.ping", event); /* steals `event`, also on failure */
  if (rc != 0) {
    st->api->call_error(call, rc, "cannot emit ok.ping", NULL);
    return;
  }
  ok_reply(st, call, json_object());
}

/* Remote function ok.greet(name: string) → string. The result is malloc'ed and owned by the host. */
static int ok_greet(ah_call *call, const char *name, char **out) {
  char *text = NULL;
  (void)call;

  if (name == NULL || out == NULL) {
    return AH_EINVAL;
  }
  if (asprintf(&text, "hello, %s", name) < 0) {
    return AH_ENOMEM;
  }
  *out = text;
  return 0;
}

/* Every registration of the mount; returns the first failure. */
static int ok_register(ok_state *st) {
  const ah_host_api *api = st->api;
  int rc = 0;

  const ah_method_def methods[] = {
      {.struct_size = sizeof(ah_method_def),
       .name = "ok.echo",
       .handler = ok_echo,
       .flags = AH_METHOD_PUBLIC,
       .data = st},
      {.struct_size = sizeof(ah_method_def),
       .name = "ok.add",
       .handler = ok_add,
       .flags = AH_METHOD_PUBLIC,
       .data = st},
      {.struct_size = sizeof(ah_method_def),
       .name = "ok.admin",
       .handler = ok_admin,
       .flags = AH_METHOD_PRIVILEGED,
       .data = st},
      {.struct_size = sizeof(ah_method_def),
       .name = "ok.emit",
       .handler = ok_emit,
       .flags = AH_METHOD_PUBLIC,
       .data = st},
  };
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
    rc = api->register_method(st->m, &methods[i]);
    if (rc != 0) {
      return rc;
    }
  }

  rc = api->register_event(st->m, "ok.ping", AH_EVENT_ALLOWLISTED);
  if (rc != 0) {
    return rc;
  }
  rc = api->register_event(st->m, "ok.internal", 0);
  if (rc != 0) {
    return rc;
  }

  const ah_remote_param greet_params[] = {
      {.name = "name", .type = AH_TYPE_STRING, .optional = false},
  };
  const ah_remote_def greet = {
      .struct_size = sizeof(ah_remote_def),
      .param_size = sizeof(ah_remote_param),
      .ns = "ok",
      .method = "greet",
      .params = greet_params,
      .nparams = sizeof(greet_params) / sizeof(greet_params[0]),
      .result = AH_TYPE_STRING,
      .result_optional = false,
      .flags = 0,
      .lookup = AH_LOOKUP_NONE,
      /* Through void (*)(void), the one function type GCC's -Wcast-function-type accepts for any cast. */
      .fn = AH_REMOTE_FN(ok_greet),
  };
  return api->register_remote(st->m, &greet);
}

static int ok_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  ok_state *st = NULL;
  int rc = 0;
  (void)config;

  st = calloc(1, sizeof(*st));
  if (st == NULL) {
    return AH_ENOMEM;
  }
  st->m = m;
  st->api = api;

  rc = ok_register(st);
  if (rc != 0) {
    /* The host undoes the registrations and does not call withdraw(): free what we allocated. */
    api->log(m, AH_PLOG_ERROR, "mount failed: %s", ah_strerror(rc));
    free(st);
    return rc;
  }
  *state = st;
  return 0;
}

static void ok_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  free(state);
  done(m);
}

static const ah_plugin_desc ok_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "ok",
    .version = "1.0.0",
    .description = "test fixture: a well-behaved plugin with methods, events and a remote descriptor",
    .mount = ok_mount,
    .withdraw = ok_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &ok_desc;
}
