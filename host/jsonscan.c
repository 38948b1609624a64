/* agenthost — a shallow JSON scanner (jsonscan.h). */
#include "jsonscan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *skip_ws(const char *p, const char *e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
    p++;
  return p;
}

/* The end of the string starting at p ('"'), or NULL. *esc: it holds a backslash. */
static const char *skip_string(const char *p, const char *e, bool *esc) {
  p++;
  while (p < e) {
    const char *q = memchr(p, '"', (size_t)(e - p));
    if (!q)
      return NULL;
    /* count the backslashes before the quote */
    const char *b = q;
    while (b > p && b[-1] == '\\')
      b--;
    if (memchr(p, '\\', (size_t)(q - p)) && esc)
      *esc = true;
    if (((q - b) & 1) == 0)
      return q + 1;
    p = q + 1;
  }
  return NULL;
}

static const char *skip_value(const char *p, const char *e) {
  if (p >= e)
    return NULL;
  if (*p == '"')
    return skip_string(p, e, NULL);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    while (p < e) {
      char c = *p;
      if (c == '"') {
        p = skip_string(p, e, NULL);
        if (!p)
          return NULL;
        continue;
      }
      if (c == '{' || c == '[') {
        if (++depth > 2048)
          return NULL;
      } else if (c == '}' || c == ']') {
        if (--depth == 0)
          return p + 1;
      }
      p++;
    }
    return NULL;
  }
  const char *q = p;
  while (q < e && *q != ',' && *q != '}' && *q != ']' && *q != ' ' && *q != '\t' && *q != '\r' && *q != '\n')
    q++;
  return q > p ? q : NULL;
}

/* Find the values of `keys` at the top level of the object in [p, e). Returns 0, or -1 when it is not a
 * plain object (or a wanted key is repeated). */
int ah__json_scan(const char *p, const char *e, const char *const *keys, size_t nk, ah_span *out) {
  size_t kls[16];
  if (nk > 16)
    return -1;
  for (size_t i = 0; i < nk; i++) {
    out[i].p = NULL, out[i].n = 0;
    kls[i] = strlen(keys[i]);
  }
  p = skip_ws(p, e);
  if (p >= e || *p != '{')
    return -1;
  p = skip_ws(p + 1, e);
  if (p < e && *p == '}')
    return skip_ws(p + 1, e) == e ? 0 : -1;
  for (;;) {
    if (p >= e || *p != '"')
      return -1;
    bool esc = false;
    const char *ke = skip_string(p, e, &esc);
    if (!ke || esc)
      return -1;
    const char *k = p + 1;
    size_t kl = (size_t)(ke - 1 - k);
    p = skip_ws(ke, e);
    if (p >= e || *p != ':')
      return -1;
    p = skip_ws(p + 1, e);
    const char *ve = skip_value(p, e);
    if (!ve)
      return -1;
    for (size_t i = 0; i < nk; i++)
      if (kls[i] == kl && memcmp(keys[i], k, kl) == 0) {
        if (out[i].p)
          return -1;
        out[i].p = p;
        out[i].n = (size_t)(ve - p);
      }
    p = skip_ws(ve, e);
    if (p < e && *p == ',') {
      p = skip_ws(p + 1, e);
      continue;
    }
    if (p < e && *p == '}')
      return 0;
    return -1;
  }
}

/* A plain string value (no escapes) as a JSON string, or NULL. */
json_t *ah__span_str(ah_span s) {
  if (!s.p || s.n < 2 || s.p[0] != '"' || memchr(s.p, '\\', s.n))
    return NULL;
  for (size_t i = 1; i + 1 < s.n; i++)
    if ((unsigned char)s.p[i] < 0x20) /* a raw control byte is not JSON: the parser refuses the line */
      return NULL;
  return json_stringn(s.p + 1, s.n - 2); /* NULL when not UTF-8 */
}

json_t *ah__span_int(ah_span s) {
  if (!s.p || !s.n || s.n > 19)
    return NULL;
  char buf[24];
  memcpy(buf, s.p, s.n);
  buf[s.n] = '\0';
  char *end = NULL;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  return errno || *end ? NULL : json_integer(v);
}

bool ah__span_is(ah_span s, const char *lit) {
  size_t n = strlen(lit);
  return s.p && s.n == n + 2 && s.p[0] == '"' && memcmp(s.p + 1, lit, n) == 0;
}

json_t *ah__span_json(ah_span s) {
  return s.p ? json_loadb(s.p, s.n, JSON_DECODE_ANY, NULL) : NULL;
}
