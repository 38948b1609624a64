/* agenthost — the host's logger. See log.h for the contract.
 *
 * A record is built on the stack and written with one write(2) under a mutex, so records from several
 * threads never interleave. A record is at most AH__LOG_RECORD_MAX bytes (PIPE_BUF), which keeps a single
 * write(2) to a pipe atomic even against other processes that share our stderr; longer messages are cut
 * and end in "...". The logger never allocates, so it can report an allocation failure.
 */
#include "log.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* One record, newline included. */
#define AH__LOG_RECORD_MAX PIPE_BUF
/* The longest component name kept; longer ones are cut with "...". */
#define AH__LOG_COMPONENT_MAX 64

static _Atomic int log_level = AH_LOG_INFO;
static _Atomic int log_fd = -1;
static pthread_mutex_t log_write_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {
    [AH_LOG_ERROR] = "error",
    [AH_LOG_WARN] = "warn",
    [AH_LOG_INFO] = "info",
    [AH_LOG_DEBUG] = "debug",
};

static const char *const level_tags[] = {
    [AH_LOG_ERROR] = "ERROR",
    [AH_LOG_WARN] = "WARN",
    [AH_LOG_INFO] = "INFO",
    [AH_LOG_DEBUG] = "DEBUG",
};

static bool level_valid(int level) {
  return level >= AH_LOG_ERROR && level <= AH_LOG_DEBUG;
}

ah_log_level ah__log_level_parse(const char *s) {
  if (!s)
    return AH_LOG_INVALID;
  for (int l = AH_LOG_ERROR; l <= AH_LOG_DEBUG; l++)
    if (strcasecmp(s, level_names[l]) == 0)
      return (ah_log_level)l;
  return AH_LOG_INVALID;
}

const char *ah__log_level_name(ah_log_level level) {
  return level_valid((int)level) ? level_names[level] : "invalid";
}

void ah__log_set_level(ah_log_level level) {
  /* An invalid level is ignored rather than silencing or flooding the log. */
  if (level_valid((int)level))
    atomic_store(&log_level, (int)level);
}

ah_log_level ah__log_get_level(void) {
  return (ah_log_level)atomic_load(&log_level);
}

void ah__log_set_fd(int fd) {
  atomic_store(&log_fd, fd < 0 ? -1 : fd);
}

/* Length of the valid UTF-8 sequence at `s` (at most `n` bytes), or 0 if the bytes there are not one.
 * Overlong forms, UTF-16 surrogates and code points above U+10FFFF are invalid. */
static size_t utf8_seq_len(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned char c = s[0];
  size_t len = 0;
  uint32_t v = 0;
  uint32_t min = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
    v = c & 0x1f;
    min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    v = c & 0x0f;
    min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    v = c & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  if (n < len)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    v = (v << 6) | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
    return 0;
  *cp = v;
  return len;
}

/* The escaped form of the character at `in` (at most `n` bytes): writes it to `tok` (at least 8 bytes)
 * and returns its length; *consumed is set to the number of input bytes it stands for. */
static size_t escape_token(const unsigned char *in, size_t n, char tok[8], size_t *consumed) {
  static const char hex[] = "0123456789abcdef";
  unsigned char c = in[0];
  *consumed = 1;
  if (c == '\n')
    return (size_t)snprintf(tok, 8, "\\n");
  if (c == '\r')
    return (size_t)snprintf(tok, 8, "\\r");
  if (c == '\t')
    return (size_t)snprintf(tok, 8, "\\t");
  if (c == '\\')
    return (size_t)snprintf(tok, 8, "\\\\");
  if (c < 0x20 || c == 0x7f) {
    memcpy(tok, "\\u00", 4);
    tok[4] = hex[c >> 4];
    tok[5] = hex[c & 0xf];
    return 6;
  }
  if (c < 0x80) {
    tok[0] = (char)c;
    return 1;
  }
  uint32_t cp = 0;
  size_t len = utf8_seq_len(in, n, &cp);
  if (len == 0) {
    tok[0] = '\\';
    tok[1] = 'x';
    tok[2] = hex[c >> 4];
    tok[3] = hex[c & 0xf];
    return 4;
  }
  *consumed = len;
  /* C1 controls (a terminal may read U+009B as CSI) and the Unicode line and paragraph separators (a
   * viewer may break the line there) are escaped too, so that one record stays one line. */
  /* So are the bidirectional controls (U+061C, U+200E/F, U+202A..E, U+2066..9): a title or a value that
   * carries one would reorder what a terminal shows after it ("Trojan Source"). */
  bool bidi = cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
              (cp >= 0x2066 && cp <= 0x2069);
  if (cp <= 0x9f || cp == 0x2028 || cp == 0x2029 || bidi)
    return (size_t)snprintf(tok, 8, "\\u%04x", (unsigned)cp);
  memcpy(tok, in, len);
  return len;
}

/* Escape into `out` (capacity `cap` > 0, NUL-terminated). When everything does not fit, whole tokens are
 * kept while room remains for "..." and the NUL, and *truncated is set. Returns the length written. */
static size_t escape_into(char *out, size_t cap, const char *in, size_t n, bool *truncated) {
  const unsigned char *p = (const unsigned char *)in;
  char tok[8];
  size_t consumed = 0;
  *truncated = false;
  if (cap == 0)
    return 0;

  /* First pass: does the whole escaped text fit? Then no room has to be kept for the marker. */
  size_t total = 0;
  for (size_t i = 0; i < n; i += consumed)
    total += escape_token(p + i, n - i, tok, &consumed);
  size_t limit = total + 1 <= cap ? cap - 1 : (cap > 4 ? cap - 4 : 0);

  size_t used = 0;
  for (size_t i = 0; i < n; i += consumed) {
    size_t len = escape_token(p + i, n - i, tok, &consumed);
    if (used + len > limit) {
      *truncated = true;
      break;
    }
    memcpy(out + used, tok, len);
    used += len;
  }
  if (*truncated) {
    size_t dots = cap - 1 - used < 3 ? cap - 1 - used : 3;
    memcpy(out + used, "...", dots);
    used += dots;
  }
  out[used] = '\0';
  return used;
}

size_t ah__log_escape(char *out, size_t cap, const char *in, size_t n) {
  bool truncated = false;
  if (!out)
    return 0;
  if (!in) {
    n = 0;
    in = "";
  }
  return escape_into(out, cap, in, n, &truncated);
}

/* Drop a multi-byte sequence that vsnprintf cut in half at the end of `s`, so the cut does not show up as
 * \xXX bytes. Returns the new length. */
static size_t trim_partial_utf8(const char *s, size_t n) {
  size_t back = 0;
  while (back < 4 && back < n && ((unsigned char)s[n - 1 - back] & 0xc0) == 0x80)
    back++;
  if (back >= n)
    return n;
  unsigned char lead = (unsigned char)s[n - 1 - back];
  size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  if (want > 1 && back + 1 < want)
    return n - 1 - back;
  return n;
}

static void write_all(int fd, const char *buf, size_t len) {
  pthread_mutex_lock(&log_write_lock);
  while (len > 0) {
    ssize_t w = write(fd, buf, len);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break; /* nowhere left to report it */
    buf += w;
    len -= (size_t)w;
  }
  pthread_mutex_unlock(&log_write_lock);
}

void ah__logv(ah_log_level level, const char *component, const char *fmt, va_list ap) {
  /* An out-of-range level is a caller bug; it is logged as an error rather than lost. */
  if (!level_valid((int)level))
    level = AH_LOG_ERROR;
  if ((int)level > atomic_load(&log_level))
    return;
  int saved_errno = errno;

  char record[AH__LOG_RECORD_MAX];
  size_t used = 0;

  struct timespec now = {0};
  struct tm tm = {0};
  clock_gettime(CLOCK_REALTIME, &now);
  gmtime_r(&now.tv_sec, &tm);
  used += strftime(record, sizeof record, "%Y-%m-%dT%H:%M:%S", &tm);
  used += (size_t)snprintf(record + used, sizeof record - used, ".%03ldZ %s ", now.tv_nsec / 1000000L,
                           level_tags[level]);

  if (!component)
    component = "-";
  used += escape_into(record + used, AH__LOG_COMPONENT_MAX + 1, component, strlen(component), &(bool){false});
  memcpy(record + used, ": ", 2);
  used += 2;

  /* Formatting happens into its own buffer first: the escaped form is what must fit the record. */
  char raw[AH__LOG_RECORD_MAX];
  size_t raw_len = 0;
  bool raw_cut = false;
  if (fmt) {
    int r = vsnprintf(raw, sizeof raw, fmt, ap);
    if (r > 0) {
      raw_len = (size_t)r;
      if (raw_len >= sizeof raw) {
        raw_cut = true;
        raw_len = trim_partial_utf8(raw, sizeof raw - 1);
      }
    }
  }

  /* Room for the message: everything but the newline, and "..." when the raw text was already cut. */
  size_t room = sizeof record - used - 1; /* including the NUL escape_into writes */
  bool cut = false;
  if (raw_cut && room > 3) {
    used += escape_into(record + used, room - 3, raw, raw_len, &cut);
    if (!cut) {
      memcpy(record + used, "...", 3);
      used += 3;
    }
  } else {
    used += escape_into(record + used, room, raw, raw_len, &cut);
  }
  record[used++] = '\n';

  int fd = atomic_load(&log_fd);
  write_all(fd < 0 ? STDERR_FILENO : fd, record, used);
  errno = saved_errno;
}

void ah__log(ah_log_level level, const char *component, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ah__logv(level, component, fmt, ap);
  va_end(ap);
}
