/* What the harnesses share: the input cut into NUL-terminated fields (libFuzzer's bytes are not a
 * string), and an assertion that aborts, so a broken invariant is a finding like a crash. */
#ifndef AGENTHOST_FUZZ_SUPPORT_H
#define AGENTHOST_FUZZ_SUPPORT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                           \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                     \
    }                                                                              \
  } while (0)

/* Up to `max` fields of `data` split at `sep` into one allocation (*buf, freed by the caller); the last
 * field runs to the end. Returns the number of fields. */
static inline size_t fuzz_fields(const uint8_t *data, size_t size, char sep, char **fields, size_t max,
                                 char **buf) {
  *buf = malloc(size + 1);
  if (!*buf)
    return 0;
  memcpy(*buf, data, size);
  (*buf)[size] = '\0';
  size_t n = 0;
  char *p = *buf;
  while (n < max) {
    fields[n++] = p;
    char *q = n < max ? memchr(p, sep, (size_t)(*buf + size - p)) : NULL;
    if (!q)
      break;
    *q = '\0';
    p = q + 1;
  }
  return n;
}

#endif
