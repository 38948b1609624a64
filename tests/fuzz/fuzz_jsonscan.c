/* The shallow JSON scanner of `agenthost analyze` (host/jsonscan.c) against the full parser: on any line
 * both accept, every wanted key has the same value (and is absent alike), and a string or integer read from
 * a span is the value jansson reads. */
#include "fuzz_support.h"
#include "jsonscan.h"

static const char *const keys[] = {"kind", "seq", "data", "sessionId", "time", "id", "method", "params"};
#define NK (sizeof keys / sizeof keys[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *p = (const char *)data;
  ah_span v[NK];
  memset(v, 0, sizeof v);
  int rc = ah__json_scan(p, p + size, keys, NK, v);
  json_error_t e;
  json_t *full = json_loadb(p, size, JSON_REJECT_DUPLICATES, &e);
  if (rc == 0 && json_is_object(full)) {
    for (size_t i = 0; i < NK; i++) {
      json_t *want = json_object_get(full, keys[i]);
      FUZZ_CHECK((v[i].p == NULL) == (want == NULL));
      if (!want)
        continue;
      json_t *got = ah__span_json(v[i]);
      FUZZ_CHECK(got && json_equal(got, want));
      json_decref(got);
      json_t *s = ah__span_str(v[i]);
      if (s)
        FUZZ_CHECK(json_equal(s, want));
      json_decref(s);
      json_t *n = ah__span_int(v[i]);
      if (n)
        FUZZ_CHECK(json_equal(n, want));
      json_decref(n);
      if (json_is_string(want))
        FUZZ_CHECK(!ah__span_is(v[i], "\x01never") || strcmp(json_string_value(want), "\x01never") == 0);
    }
  }
  json_decref(full);
  return 0;
}
