/* The event-stream parser (sse.h). */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

void sse_init(sse_parser *p, size_t max_line, size_t max_event) {
  memset(p, 0, sizeof *p);
  p->max_line = max_line;
  p->max_event = max_event;
  p->retry_ms = -1;
}

void sse_free(sse_parser *p) {
  free(p->line);
  free(p->data);
  memset(p, 0, sizeof *p);
}

bool sse_pending(const sse_parser *p) {
  return p->line_len > 0 || p->has_data;
}

static int grow(char **buf, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need)
    c *= 2;
  char *b = realloc(*buf, c);
  if (!b)
    return -3;
  *buf = b;
  *cap = c;
  return 0;
}

static int dispatch(sse_parser *p, sse_fn fn, void *arg) {
  int rc = 0;
  if (p->has_data) {
    size_t n = p->data_len;
    if (n && p->data[n - 1] == '\n')
      n--;
    if (grow(&p->data, &p->data_cap, n + 1) != 0)
      return -3;
    p->data[n] = '\0';
    rc = fn(arg, p->event[0] ? p->event : "message", p->data, n);
  }
  p->data_len = 0;
  p->has_data = false;
  p->event[0] = '\0';
  return rc;
}

/* One complete line (without its end). */
static int line(sse_parser *p, sse_fn fn, void *arg) {
  const char *l = p->line;
  size_t n = p->line_len;
  p->line_len = 0;
  if (n == 0)
    return dispatch(p, fn, arg);
  if (l[0] == ':')
    return 0; /* a comment */
  const char *colon = memchr(l, ':', n);
  size_t fl = colon ? (size_t)(colon - l) : n;
  const char *v = colon ? colon + 1 : l + n;
  size_t vl = (size_t)(l + n - v);
  if (vl && *v == ' ') {
    v++;
    vl--;
  }
  if (fl == 4 && memcmp(l, "data", 4) == 0) {
    if (p->data_len + vl + 1 > p->max_event)
      return -2;
    if (grow(&p->data, &p->data_cap, p->data_len + vl + 2) != 0)
      return -3;
    memcpy(p->data + p->data_len, v, vl);
    p->data_len += vl;
    p->data[p->data_len++] = '\n';
    p->has_data = true;
  } else if (fl == 5 && memcmp(l, "event", 5) == 0) {
    size_t k = vl < sizeof p->event - 1 ? vl : sizeof p->event - 1;
    memcpy(p->event, v, k);
    p->event[k] = '\0';
  } else if (fl == 2 && memcmp(l, "id", 2) == 0) {
    if (!memchr(v, '\0', vl) && vl < sizeof p->last_id) {
      memcpy(p->last_id, v, vl);
      p->last_id[vl] = '\0';
    }
  } else if (fl == 5 && memcmp(l, "retry", 5) == 0) {
    long ms = 0;
    size_t k = 0;
    while (k < vl && v[k] >= '0' && v[k] <= '9' && ms < 100000000)
      ms = ms * 10 + (v[k++] - '0');
    if (vl > 0 && k == vl)
      p->retry_ms = ms;
  }
  /* unknown fields are ignored */
  return 0;
}

int sse_feed(sse_parser *p, const char *buf, size_t n, sse_fn fn, void *arg) {
  size_t i = 0;
  while (i < n) {
    char c = buf[i];
    if (c == '\n' && p->after_cr) { /* the LF of a CRLF */
      p->after_cr = false;
      i++;
      continue;
    }
    p->after_cr = false;
    if (c == '\r' || c == '\n') {
      p->after_cr = c == '\r';
      i++;
      int rc = line(p, fn, arg);
      if (rc)
        return rc;
      continue;
    }
    /* Copy the run up to the next line end at once. */
    size_t j = i;
    while (j < n && buf[j] != '\r' && buf[j] != '\n')
      j++;
    size_t run = j - i;
    if (p->line_len + run > p->max_line)
      return -1;
    if (grow(&p->line, &p->line_cap, p->line_len + run + 1) != 0)
      return -3;
    memcpy(p->line + p->line_len, buf + i, run);
    p->line_len += run;
    i = j;
  }
  return 0;
}
