/* agenthost — recordings (record.h). */
#include "record.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ah_recorder {
  char *dir;
  char *base; /* dir/source-runid */
  char *source;
  char *side;
  char run_id[40];
  uint64_t max_bytes;
  int max_files;
  json_t *meta;
  FILE *f;
  char path[4200];
  uint64_t bytes;
  int part;
  bool failed;
  json_t *seqs; /* conn → last seq */
};

static void now_wall(char out[32]) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char day[24];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, 32, "%.19s.%03dZ", day, (int)(ts.tv_nsec / 1000000));
}

static int64_t now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void new_run_id(char out[40]) {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, b, sizeof b) : -1;
  if (fd >= 0)
    close(fd);
  if (got != (ssize_t)sizeof b) {
    int64_t t = now_mono() ^ (int64_t)getpid();
    memcpy(b, &t, sizeof t);
    memcpy(b + 8, &t, sizeof t);
  }
  /* time-ordered: ms since the epoch first, then randomness */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned long long ms = (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
  snprintf(out, 40, "%012llx-%02x%02x%02x%02x%02x%02x", ms & 0xffffffffffffULL, b[0], b[1], b[2], b[3], b[4],
           b[5]);
}

static void boot_id(char *out, size_t cap) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  out[0] = '\0';
  if (f) {
    if (fgets(out, (int)cap, f))
      out[strcspn(out, "\n")] = '\0';
    fclose(f);
  }
  if (!out[0])
    snprintf(out, cap, "unknown");
}

/* ---- redaction ---------------------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool credential_key(const char *key) {
  static const char *const names[] = {"authorization", "proxy-authorization",
                                      "cookie",        "set-cookie",
                                      "token",         "access_token",
                                      "refresh_token", "id_token",
                                      "api_key",       "apikey",
                                      "api-key",       "x-api-key",
                                      "secret",        "client_secret",
                                      "password",      "passwd",
                                      "bearer",        "bearer_token",
                                      "key",           "private_key"};
  char low[128];
  size_t n = strlen(key);
  if (n >= sizeof low)
    n = sizeof low - 1;
  for (size_t i = 0; i < n; i++)
    low[i] = (char)tolower((unsigned char)key[i]);
  low[n] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(low, names[i]) == 0)
      return true;
  return ends_with(low, "_token") || ends_with(low, "_key") || ends_with(low, "-key") ||
         ends_with(low, "_secret") || ends_with(low, "_password") || ends_with(low, "apikey") ||
         ends_with(low, "accesstoken");
}

/* A string's credentials: "Bearer X", "agenthost.bearer.X", "token=X" (URLs). NULL: nothing to change. */
static char *redact_text(const char *s) {
  /* each credential ends at a blank, '&', '#', ',', a quote or a line end */
  static const struct {
    const char *mark;
  } marks[] = {{"Bearer "}, {"bearer "}, {"agenthost.bearer."}, {"token="}};
  bool any = false;
  for (size_t i = 0; i < sizeof marks / sizeof marks[0] && !any; i++)
    any = strstr(s, marks[i].mark) != NULL;
  if (!any)
    return NULL;
  size_t n = strlen(s), cap = n + 64, o = 0;
  char *out = malloc(cap);
  if (!out)
    return NULL;
  for (size_t i = 0; i < n;) {
    size_t m = 0;
    for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++) {
      size_t ml = strlen(marks[k].mark);
      if (strncmp(s + i, marks[k].mark, ml) == 0) {
        m = ml;
        break;
      }
    }
    if (!m) {
      out[o++] = s[i++];
      continue;
    }
    static const char red[] = "[redacted]";
    if (o + m + sizeof red + (n - i) >= cap) {
      cap = (o + m + sizeof red + (n - i)) * 2;
      char *nb = realloc(out, cap);
      if (!nb) {
        free(out);
        return NULL;
      }
      out = nb;
    }
    memcpy(out + o, s + i, m);
    o += m;
    i += m;
    size_t j = i;
    while (j < n && s[j] != ' ' && s[j] != '&' && s[j] != '#' && s[j] != '"' && s[j] != ',' && s[j] != '\n')
      j++;
    if (j > i) {
      memcpy(out + o, red, sizeof red - 1);
      o += sizeof red - 1;
    }
    i = j;
  }
  out[o] = '\0';
  return out;
}

void ah_recorder_redact(json_t *v) {
  if (json_is_object(v)) {
    const char *k;
    json_t *x;
    void *tmp;
    json_object_foreach_safe(v, tmp, k, x) {
      if (credential_key(k) && (json_is_string(x) || json_is_array(x) || json_is_object(x)))
        json_object_set_new(v, k, json_string("[redacted]"));
      else
        ah_recorder_redact(x);
    }
  } else if (json_is_array(v)) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      if (json_is_string(x)) {
        char *r = redact_text(json_string_value(x));
        if (r) {
          json_array_set_new(v, i, json_string(r));
          free(r);
        }
      } else {
        ah_recorder_redact(x);
      }
    }
  }
  if (json_is_object(v)) { /* strings directly under an object */
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
      if (!json_is_string(x))
        continue;
      char *r = redact_text(json_string_value(x));
      if (r) {
        json_string_set(x, r);
        free(r);
      }
    }
  }
}

/* ---- files ----------------------------------------------------------------------------------------------
 */

static int open_part(ah_recorder *r, char *err, size_t cap) {
  char p[4200], mp[4200];
  if (r->part == 1) {
    snprintf(p, sizeof p, "%s.jsonl", r->base);
    snprintf(mp, sizeof mp, "%s.meta.json", r->base);
  } else {
    snprintf(p, sizeof p, "%s.%d.jsonl", r->base, r->part);
    snprintf(mp, sizeof mp, "%s.%d.meta.json", r->base, r->part);
  }
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, cap, "cannot create the recording %s: %s", p, strerror(errno));
    return -1;
  }
  r->f = fdopen(fd, "w");
  if (!r->f) {
    close(fd);
    snprintf(err, cap, "cannot open the recording %s", p);
    return -1;
  }
  snprintf(r->path, sizeof r->path, "%s", p);
  r->bytes = 0;
  char wall[32], boot[64];
  now_wall(wall);
  boot_id(boot, sizeof boot);
  json_t *m =
      json_pack("{s:s, s:i, s:s, s:s, s:s, s:{s:s, s:s, s:s}, s:s, s:i}", "format", "agenthost.recording",
                "version", 1, "source", r->source, "side", r->side, "recordingRunId", r->run_id, "clock",
                "mono", "CLOCK_MONOTONIC", "domain", boot, "unit", "ns", "started", wall, "part", r->part);
  if (r->meta)
    json_object_update_missing(m, r->meta);
  ah_recorder_redact(m);
  int mfd = open(mp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  int rc = mfd >= 0 ? json_dumpfd(m, mfd, JSON_INDENT(2) | JSON_SORT_KEYS) : -1;
  if (mfd >= 0 && write(mfd, "\n", 1) != 1)
    rc = -1;
  if (mfd >= 0)
    close(mfd);
  json_decref(m);
  if (rc != 0) {
    snprintf(err, cap, "cannot write the recording's metadata %s", mp);
    return -1;
  }
  /* keep at most max_files parts */
  int old = r->part - r->max_files;
  if (old >= 1) {
    char op[4200];
    if (old == 1) {
      snprintf(op, sizeof op, "%s.jsonl", r->base);
      unlink(op);
      snprintf(op, sizeof op, "%s.meta.json", r->base);
    } else {
      snprintf(op, sizeof op, "%s.%d.jsonl", r->base, old);
      unlink(op);
      snprintf(op, sizeof op, "%s.%d.meta.json", r->base, old);
    }
    unlink(op);
  }
  return 0;
}

int ah_recorder_open(const ah_recorder_opts *o, ah_recorder **out, char *err, size_t cap) {
  *out = NULL;
  if (!o || !o->dir || !o->source || o->dir[0] != '/') {
    snprintf(err, cap, "a recording needs an absolute directory and a source");
    return -1;
  }
  if (mkdir(o->dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, cap, "cannot create the recording directory %s: %s", o->dir, strerror(errno));
    return -1;
  }
  ah_recorder *r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  r->dir = strdup(o->dir);
  r->source = strdup(o->source);
  r->side = strdup(o->side ? o->side : "host");
  r->max_bytes = o->max_bytes ? o->max_bytes : (64u << 20);
  r->max_files = o->max_files > 0 ? o->max_files : 8;
  r->meta = o->meta ? json_deep_copy(o->meta) : NULL;
  r->seqs = json_object();
  new_run_id(r->run_id);
  char safe[128];
  size_t n = 0;
  for (const char *p = o->source; *p && n + 1 < sizeof safe; p++)
    safe[n++] = (char)(isalnum((unsigned char)*p) || *p == '-' || *p == '_' ? *p : '-');
  safe[n] = '\0';
  size_t bl = strlen(o->dir) + strlen(safe) + strlen(r->run_id) + 4;
  r->base = malloc(bl);
  if (r->base)
    snprintf(r->base, bl, "%s/%s-%s", o->dir, safe, r->run_id);
  r->part = 1;
  if (!r->dir || !r->source || !r->side || !r->seqs || !r->base || open_part(r, err, cap) != 0) {
    if (!err[0])
      snprintf(err, cap, "out of memory");
    ah_recorder_close(r);
    return -1;
  }
  *out = r;
  return 0;
}

static void write_record(ah_recorder *r, json_t *rec) {
  if (r->failed || !r->f) {
    json_decref(rec);
    return;
  }
  char *line = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(rec);
  if (!line) {
    r->failed = true;
    return;
  }
  size_t n = strlen(line);
  if (fwrite(line, 1, n, r->f) != n || fputc('\n', r->f) == EOF || fflush(r->f) != 0)
    r->failed = true;
  free(line);
  r->bytes += n + 1;
  if (!r->failed && r->bytes >= r->max_bytes) {
    fclose(r->f);
    r->f = NULL;
    r->part++;
    char err[300];
    if (open_part(r, err, sizeof err) != 0)
      r->failed = true;
  }
}

static json_t *head(ah_recorder *r, const char *conn) {
  json_int_t seq = json_integer_value(json_object_get(r->seqs, conn)) + 1;
  json_object_set_new(r->seqs, conn, json_integer(seq));
  char wall[32];
  now_wall(wall);
  return json_pack("{s:i, s:s, s:s, s:s, s:I, s:s, s:I}", "v", 1, "side", r->side, "source", r->source,
                   "conn", conn, "seq", seq, "wall", wall, "mono", (json_int_t)now_mono());
}

void ah_recorder_message(ah_recorder *r, const char *conn, bool sent, const char *data, size_t len,
                         const char *corr) {
  if (!r || r->failed || !conn)
    return;
  json_t *rec = head(r, conn);
  json_object_set_new(rec, "dir", json_string(sent ? "sent" : "received"));
  if (corr)
    json_object_set_new(rec, "corr", json_string(corr));
  json_t *p = json_loadb(data ? data : "", len, JSON_DECODE_ANY, NULL);
  if (p) {
    ah_recorder_redact(p);
    json_object_set_new(rec, "payload", p);
  } else {
    json_t *raw = json_stringn(data ? data : "", len);
    if (!raw)
      raw = json_sprintf("(%zu bytes, not UTF-8)", len);
    char *red = redact_text(json_string_value(raw));
    if (red) {
      json_string_set(raw, red);
      free(red);
    }
    json_object_set_new(rec, "raw", raw);
  }
  write_record(r, rec);
}

void ah_recorder_mark(ah_recorder *r, const char *conn, const char *event, const char *detail) {
  if (!r || r->failed || !conn || !event)
    return;
  json_t *rec = head(r, conn);
  json_object_set_new(rec, "event", json_string(event));
  if (detail)
    json_object_set_new(rec, "detail", json_string(detail));
  write_record(r, rec);
}

const char *ah_recorder_path(const ah_recorder *r) {
  return r ? r->path : NULL;
}

bool ah_recorder_failed(const ah_recorder *r) {
  return r && r->failed;
}

void ah_recorder_close(ah_recorder *r) {
  if (!r)
    return;
  if (r->f)
    fclose(r->f);
  free(r->dir);
  free(r->base);
  free(r->source);
  free(r->side);
  json_decref(r->meta);
  json_decref(r->seqs);
  free(r);
}
