/* The JSON-lines channel of a benchmark's child (bench_lines.h). */
#include "bench_lines.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void bench_chan_reap(bench_chan *c) {
  bench_reap(&c->proc, true);
  free(c->rbuf);
  c->rbuf = NULL;
  c->rlen = c->rcap = 0;
}

int bench_chan_send(bench_chan *c, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof buf - 1) {
    bench_fail(&c->proc, "message too long");
    return -1;
  }
  buf[n++] = '\n';
  for (int off = 0; off < n;) {
    ssize_t w = write(c->proc.to_fd, buf + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      bench_fail(&c->proc, "write to the child: %s", strerror(errno));
      return -1;
    }
    off += (int)w;
  }
  return 0;
}

json_t *bench_chan_next(bench_chan *c, uint64_t deadline) {
  for (;;) {
    char *nl = c->rlen ? memchr(c->rbuf, '\n', c->rlen) : NULL;
    if (nl) {
      size_t len = (size_t)(nl - c->rbuf);
      json_error_t err;
      json_t *msg = json_loadb(c->rbuf, len, 0, &err);
      memmove(c->rbuf, nl + 1, c->rlen - len - 1);
      c->rlen -= len + 1;
      if (!msg || !json_is_object(msg)) {
        bench_fail(&c->proc, "a line that is not a JSON object on stdout");
        json_decref(msg);
        return NULL;
      }
      return msg;
    }
    uint64_t now = bench_now_ns();
    if (now >= deadline) {
      bench_fail(&c->proc, "no answer before the deadline");
      return NULL;
    }
    struct pollfd p = {.fd = c->proc.from_fd, .events = POLLIN};
    int n = poll(&p, 1, (int)((deadline - now) / 1000000u) + 1);
    if (n < 0 && errno != EINTR) {
      bench_fail(&c->proc, "poll: %s", strerror(errno));
      return NULL;
    }
    if (n <= 0)
      continue;
    if (c->rcap - c->rlen < 65536) {
      c->rcap = c->rcap * 2 + 65536;
      char *b = realloc(c->rbuf, c->rcap);
      if (!b) {
        bench_fail(&c->proc, "out of memory");
        return NULL;
      }
      c->rbuf = b;
    }
    ssize_t got = read(c->proc.from_fd, c->rbuf + c->rlen, c->rcap - c->rlen);
    if (got == 0) {
      bench_fail(&c->proc, "the child closed its stdout");
      return NULL;
    }
    if (got < 0 && errno != EINTR && errno != EAGAIN) {
      bench_fail(&c->proc, "read: %s", strerror(errno));
      return NULL;
    }
    if (got > 0)
      c->rlen += (size_t)got;
  }
}

/* Wait for the answer to request `id` (returned; the caller frees it). Notifications are passed to `on_note`
 * (may be NULL); requests from the child are answered -32601. */
json_t *bench_chan_answer(bench_chan *c, int64_t id, void (*on_note)(const json_t *msg, void *arg),
                          void *arg) {
  uint64_t deadline = bench_now_ns() + BENCH_CHAN_WAIT_NS;
  for (;;) {
    json_t *msg = bench_chan_next(c, deadline);
    if (!msg)
      return NULL;
    const json_t *mid = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    if (method && !mid) {
      if (on_note)
        on_note(msg, arg);
    } else if (method) {
      char *idtext = json_dumps(mid, JSON_ENCODE_ANY | JSON_COMPACT);
      bench_chan_send(
          c, "{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32601,\"message\":\"method not found\"}}",
          idtext ? idtext : "null");
      free(idtext);
    } else if (json_is_integer(mid) && json_integer_value(mid) == id) {
      if (!json_object_get(msg, "result")) {
        char *text = json_dumps(msg, JSON_COMPACT);
        bench_fail(&c->proc, "request %lld failed: %.300s", (long long)id, text ? text : "?");
        free(text);
        json_decref(msg);
        return NULL;
      }
      return msg;
    }
    json_decref(msg);
  }
}

/* One prompt through agenthost: the times to the tool's result and to the turn's end. Answers an approval
 * with allow_always (the first call only). */
int bench_chan_tool_prompt(bench_chan *c, int64_t id, const char *text, uint64_t *to_result,
                           uint64_t *to_end) {
  uint64_t t0 = bench_now_ns();
  if (bench_chan_send(
          c, "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"session/prompt\",\"params\":{\"text\":\"%s\"}}",
          (long long)id, text) != 0)
    return -1;
  uint64_t deadline = t0 + BENCH_CHAN_WAIT_NS;
  bool have_result = false;
  for (;;) {
    json_t *m = bench_chan_next(c, deadline);
    if (!m)
      return -1;
    const char *method = json_string_value(json_object_get(m, "method"));
    if (method && strcmp(method, "request/approval") == 0) {
      char *idtext = json_dumps(json_object_get(m, "id"), JSON_ENCODE_ANY);
      bench_chan_send(c, "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"optionId\":\"allow_always\"}}",
                      idtext ? idtext : "null");
      free(idtext);
    } else if (method && strcmp(method, "session.event") == 0) {
      json_t *ev = json_object_get(json_object_get(m, "params"), "event");
      const char *kind = json_string_value(json_object_get(ev, "kind"));
      if (kind && strcmp(kind, "tool/result") == 0) {
        json_t *data = json_object_get(ev, "data");
        if (json_is_true(json_object_get(data, "isError"))) {
          char *t = json_dumps(data, JSON_COMPACT);
          bench_fail(&c->proc, "the tool failed: %.300s", t ? t : "?");
          free(t);
          json_decref(m);
          return -1;
        }
        *to_result = bench_now_ns() - t0;
        have_result = true;
      } else if (kind && strcmp(kind, "turn/ended") == 0) {
        *to_end = bench_now_ns() - t0;
        json_decref(m);
        if (!have_result) {
          bench_fail(&c->proc, "the turn ended without a tool result");
          return -1;
        }
        return 0;
      }
    }
    json_decref(m);
  }
}
