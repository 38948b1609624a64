/* agenthost — reading a stream to its end, bounded. See readall.h. */
#include "readall.h"

#include <stdlib.h>

#include "agenthost/errors.h"

int ah__read_all(FILE *f, size_t max, char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 1 >= cap) {
      size_t ncap = cap ? cap * 2 : 65536;
      char *nb = realloc(buf, ncap);
      if (!nb) {
        free(buf);
        return AH_ENOMEM;
      }
      buf = nb;
      cap = ncap;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (n > max) {
      free(buf);
      return AH_E2BIG;
    }
    if (got == 0)
      break;
  }
  if (ferror(f)) {
    free(buf);
    return AH_EIO;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return 0;
}
