/* Small helpers shared by the core. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "internal.h"

void ah__list_init(ah__link *head) {
  head->prev = head;
  head->next = head;
}

bool ah__list_empty(const ah__link *head) {
  return head->next == head;
}

void ah__list_push(ah__link *head, ah__link *node) {
  node->prev = head->prev;
  node->next = head;
  head->prev->next = node;
  head->prev = node;
}

void ah__list_remove(ah__link *node) {
  if (!node->next || node->next == node)
    return;
  node->prev->next = node->next;
  node->next->prev = node->prev;
  node->prev = node;
  node->next = node;
}

void ah__list_take_all(ah__link *dst, ah__link *src) {
  ah__list_init(dst);
  if (ah__list_empty(src))
    return;
  dst->next = src->next;
  dst->prev = src->prev;
  dst->next->prev = dst;
  dst->prev->next = dst;
  ah__list_init(src);
}

char *ah__strdup(const char *s) {
  return s ? strdup(s) : NULL;
}

void ah__time_rfc3339(char out[32]) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char buf[96];
  snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));
  memcpy(out, buf, 31); /* 24 characters for any year 0..9999 */
  out[31] = '\0';
}

uint64_t ah__time_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void ah__uuid7(char out[37]) {
  /* RFC 9562 version 7: 48 bits of Unix milliseconds, then random bits with the version and variant set.
   * Ids minted in the same millisecond by one process are ordered by a counter in the random field, so
   * ids sort by creation. */
  static uint64_t last_ms = 0;
  static uint16_t counter = 0;
  uint64_t ms = ah__time_ms();
  uint8_t b[16];
  if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
    for (size_t i = 0; i < sizeof b; i++)
      b[i] = (uint8_t)rand();
  }
  if (ms <= last_ms) {
    ms = last_ms;
    counter++;
  } else {
    last_ms = ms;
    counter = (uint16_t)(b[6] & 0x03); /* a small random start leaves room to count */
  }
  for (int i = 0; i < 6; i++)
    b[i] = (uint8_t)(ms >> (40 - 8 * i));
  b[6] = (uint8_t)(0x70 | ((counter >> 8) & 0x0f));
  b[7] = (uint8_t)(counter & 0xff);
  b[8] = (uint8_t)(0x80 | (b[8] & 0x3f));
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
           b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int ah__mkdirs(const char *dir, const char **failed) {
  static char where[4096];
  if (failed)
    *failed = dir;
  if (!dir || strlen(dir) >= sizeof where)
    return -ENAMETOOLONG;
  /* Each missing parent, then the directory itself: created 0700; existing ones are left as they are. */
  memcpy(where, dir, strlen(dir) + 1);
  for (char *p = where + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(where, 0700) != 0 && errno != EEXIST) {
      if (failed)
        *failed = where;
      return -errno;
    }
    *p = '/';
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return -errno;
  return 0;
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------ */

int ah__utf8_seq(const unsigned char *s, size_t n, bool *cut) {
  *cut = false;
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  int need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2;
    lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2;
    hi = 0x9F; /* no UTF-16 surrogates */
  } else if (c == 0xF0) {
    need = 3;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3;
    hi = 0x8F; /* nothing above U+10FFFF */
  } else {
    return -1;
  }
  for (int i = 1; i <= need; i++) {
    if ((size_t)i >= n) {
      *cut = true;
      return -i;
    }
    if (s[i] < lo || s[i] > hi)
      return -i;
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

/* A JSON string of `s` with every invalid sequence replaced by U+FFFD (its maximal subpart, as Unicode
 * recommends). New reference; NULL when out of memory. */
json_t *ah__json_lossy_string(const char *s, size_t n) {
  if (n == 0)
    return json_string(""); /* json_stringn(NULL, 0) would fail */
  const unsigned char *u = (const unsigned char *)s;
  size_t bad = 0;
  bool cut = false;
  for (size_t i = 0; i < n;) {
    int k = ah__utf8_seq(u + i, n - i, &cut);
    if (k < 0)
      bad++;
    i += (size_t)(k < 0 ? -k : k);
  }
  if (bad == 0)
    return json_stringn(s, n);
  char *buf = malloc(n + bad * 3);
  if (!buf)
    return NULL;
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    int k = ah__utf8_seq(u + i, n - i, &cut);
    if (k > 0) {
      memcpy(buf + o, s + i, (size_t)k);
      o += (size_t)k;
      i += (size_t)k;
    } else {
      memcpy(buf + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i += (size_t)-k;
    }
  }
  json_t *r = json_stringn(buf, o);
  free(buf);
  return r;
}

void ah__wipe_free(char *secret) {
  if (!secret)
    return;
  explicit_bzero(secret, strlen(secret));
  free(secret);
}
