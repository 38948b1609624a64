/* REMOTE-GATEWAY-TYPES: the remote gateway's argument codec (host/remote.c, through libffi): a real host with
 * the fixture plugin tests/plugins/remote-types.c mounted; the input's first byte picks a descriptor and the
 * caller's authority, the rest is the JSON `args`. Every call is answered once: a result that serializes, or
 * an error with a message; unknown fields, wrong types and NUL bytes in strings are refused, never called. */
#include <limits.h>
#include <unistd.h>
#include <uv.h>

#include "fuzz_support.h"
#include "internal.h"

typedef struct answer {
  bool done;
  int status;
  char *text;
} answer;

static void on_reply(const ah_outcome *o, void *arg) {
  answer *a = arg;
  FUZZ_CHECK(!a->done);
  a->done = true;
  a->status = o->status;
  if (o->status == 0)
    a->text = json_dumps(o->result ? o->result : json_null(), JSON_ENCODE_ANY | JSON_COMPACT);
  else
    FUZZ_CHECK(o->message && o->message[0]);
}

static uv_loop_t loop;
static ah_host *host;
static char methods[64][65];
static json_t *params_of[64]; /* each descriptor's parameters, from remote.describe */
static size_t nmethods;

static void setup(void) {
  uv_loop_init(&loop);
  ah_host_opts opts = {.loop = &loop, .config = NULL, .mode = "serve", .drain_ms = 1000};
  FUZZ_CHECK(ah__host_new(&opts, &host) == 0);
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  FUZZ_CHECK(n > 0);
  exe[n] = '\0';
  *strrchr(exe, '/') = '\0';
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/remote-types.so", exe);
  char *why = NULL;
  FUZZ_CHECK(ah__host_load(host, path, NULL, NULL, &why) == 0);
  json_t *d = ah__remote_describe(host);
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(d, i, e) {
    const char *m = json_string_value(json_object_get(e, "method"));
    if (m && strcmp(m, "slow") != 0 && nmethods < 64) { /* "slow" sleeps as long as it is told */
      params_of[nmethods] = json_incref(json_object_get(e, "params"));
      snprintf(methods[nmethods++], sizeof methods[0], "%s", m);
    }
  }
  json_decref(d);
  FUZZ_CHECK(nmethods > 10);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!host)
    setup();
  if (size < 1)
    return 0;
  size_t which = data[0] % nmethods;
  const char *method = methods[which];
  static const ah_caller lan = {
      .struct_size = sizeof(ah_caller), .authority = AH_AUTH_LAN, .surface = "fuzz"};
  static const ah_caller admin = {
      .struct_size = sizeof(ah_caller), .authority = AH_AUTH_ADMIN, .surface = "fuzz"};
  json_error_t e;
  json_t *args = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, &e);
  if (!args)
    return 0;
  /* A field the descriptor does not have, or args that are not an object: refused before any call. */
  bool foreign = !json_is_object(args);
  const char *k = NULL;
  json_t *x = NULL;
  json_object_foreach(args, k, x) {
    bool known = false;
    size_t i = 0;
    json_t *p = NULL;
    json_array_foreach(params_of[which], i, p) known =
        known || strcmp(json_string_value(json_object_get(p, "name")), k) == 0;
    foreign = foreign || !known;
  }
  answer a = {0};
  int rc = ah__remote_invoke(host, data[0] & 0x80 ? &admin : &lan, "types", method, args, NULL, on_reply, &a);
  json_decref(args);
  FUZZ_CHECK(rc == 0);
  for (int i = 0; i < 100000 && !a.done; i++)
    uv_run(&loop, UV_RUN_ONCE);
  FUZZ_CHECK(a.done);
  if (foreign)
    FUZZ_CHECK(a.status == AH_EINVAL || a.status == AH_EPERM); /* EPERM: a privileged one, from the LAN */
  if (a.status == 0)
    FUZZ_CHECK(a.text != NULL);
  free(a.text);
  return 0;
}
