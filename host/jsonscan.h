/* agenthost — a shallow JSON scanner (internal): the values of chosen keys of an object, located without
 * building anything, everything else skipped by its framing (strings, escapes, brackets up to 2048 deep).
 * For readers of large inputs that need a few fields of each line (`agenthost analyze`); what it cannot read
 * plainly (an escape in a wanted key or string, a raw control byte, an unexpected shape) it refuses, and the
 * caller uses the full parser, so results never depend on which path read a line. */
#ifndef AGENTHOST_HOST_JSONSCAN_H
#define AGENTHOST_HOST_JSONSCAN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ah_span {
  const char *p; /* the value's first byte, NULL when the key is absent */
  size_t n;
} ah_span;

/* The values of `keys` (at most 16) at the top level of the object in [p, e). 0, or -1 when it is not a
 * plain object or a wanted key is repeated. */
int ah__json_scan(const char *p, const char *e, const char *const *keys, size_t nk, ah_span *out);
/* A string value without escapes or control bytes, valid UTF-8, as a JSON string; else NULL. */
json_t *ah__span_str(ah_span s);
/* A whole number that fits 64 bits, else NULL. */
json_t *ah__span_int(ah_span s);
/* Whether the value is the string `lit` (no escapes). */
bool ah__span_is(ah_span s, const char *lit);
/* The value parsed (any JSON), NULL when absent or invalid. */
json_t *ah__span_json(ah_span s);

#endif
