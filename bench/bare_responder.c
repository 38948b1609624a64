/* The floor for bench/sdk.c: a minimal libuv + jansson JSON-RPC 2.0 responder over JSON Lines.
 *
 * Reads stdin (a pipe) line by line and answers every request with
 * {"jsonrpc":"2.0","id":<same>,"result":R}: R is a serverInfo-like object for `initialize` and {} for any
 * other method. Notifications get no answer; a line that is not JSON is answered -32700 with id null. One
 * uv_write() per answer, as the host's JSON-RPC peer does. Exits 0 on stdin EOF once every answer is
 * written, 1 on an I/O error. No sessions, no store, no plugins: what remains is process start-up, the
 * libuv loop, the pipe and jansson.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct out_msg {
  uv_write_t req;
  char *text; /* the answer with its "\n" */
} out_msg;

static uv_loop_t *loop;
static uv_pipe_t in_pipe;
static uv_pipe_t out_pipe;
static size_t writes_pending;
static int eof_seen;
static char *line; /* bytes of the current, unfinished line */
static size_t line_len;
static size_t line_cap;
static int exit_code;

static void on_written(uv_write_t *req, int status) {
  out_msg *m = (out_msg *)req;
  if (status < 0) {
    fprintf(stderr, "bare_responder: write: %s\n", uv_strerror(status));
    exit_code = 1;
  }
  free(m->text);
  free(m);
  if (--writes_pending == 0 && eof_seen)
    uv_close((uv_handle_t *)&out_pipe, NULL);
}

/* Send `msg` (stolen) as one line. */
static void send_msg(json_t *msg) {
  out_msg *m = calloc(1, sizeof *m);
  size_t len = msg ? json_dumpb(msg, NULL, 0, JSON_COMPACT) : 0;
  char *text = len ? malloc(len + 1) : NULL;
  if (!m || !text) {
    fprintf(stderr, "bare_responder: out of memory\n");
    exit(1);
  }
  json_dumpb(msg, text, len, JSON_COMPACT);
  json_decref(msg);
  text[len] = '\n';
  m->text = text;
  uv_buf_t buf = uv_buf_init(text, (unsigned)len + 1);
  writes_pending++;
  int rc = uv_write(&m->req, (uv_stream_t *)&out_pipe, &buf, 1, on_written);
  if (rc < 0)
    on_written(&m->req, rc);
}

static void handle_line(const char *text, size_t len) {
  if (len == 0)
    return;
  json_error_t err;
  json_t *msg = json_loadb(text, len, 0, &err);
  if (!msg) {
    send_msg(json_pack("{s:s, s:n, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", "error", "code", -32700, "message",
                       "parse error"));
    return;
  }
  json_t *id = json_object_get(msg, "id");
  const char *method = json_string_value(json_object_get(msg, "method"));
  if (id && method) {
    json_t *result = strcmp(method, "initialize") == 0
                         ? json_pack("{s:{s:s, s:s}, s:i, s:{}}", "serverInfo", "name", "bare_responder",
                                     "version", "0", "protocolVersion", 1, "capabilities")
                         : json_object();
    send_msg(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
  }
  json_decref(msg);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  static char chunk[65536];
  (void)suggested;
  *buf = uv_buf_init(chunk, sizeof chunk);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  if (n < 0) {
    if (n != UV_EOF) {
      fprintf(stderr, "bare_responder: read: %s\n", uv_strerror((int)n));
      exit_code = 1;
    } else if (line_len) {
      handle_line(line, line_len); /* a last line without its "\n" */
    }
    uv_read_stop(s);
    uv_close((uv_handle_t *)&in_pipe, NULL);
    /* uv_close() would cancel queued writes (and shutdown(2) needs a socket): close after the last one. */
    eof_seen = 1;
    if (writes_pending == 0)
      uv_close((uv_handle_t *)&out_pipe, NULL);
    return;
  }
  const char *p = buf->base, *end = buf->base + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t take = (size_t)((nl ? nl : end) - p);
    if (!nl || line_len) { /* keep the partial line, or complete the kept one */
      if (line_len + take > line_cap) {
        line_cap = (line_len + take) * 2;
        line = realloc(line, line_cap);
        if (!line) {
          fprintf(stderr, "bare_responder: out of memory\n");
          exit(1);
        }
      }
      memcpy(line + line_len, p, take);
      line_len += take;
      if (nl) {
        handle_line(line, line_len);
        line_len = 0;
      }
    } else {
      handle_line(p, take); /* a whole line inside the chunk: no copy */
    }
    p += take + (nl != NULL);
  }
}

int main(void) {
  loop = uv_default_loop();
  if (uv_guess_handle(0) != UV_NAMED_PIPE || uv_guess_handle(1) != UV_NAMED_PIPE) {
    fprintf(stderr, "bare_responder: stdin and stdout must be pipes\n");
    return 2;
  }
  if (uv_pipe_init(loop, &in_pipe, 0) || uv_pipe_open(&in_pipe, 0) || uv_pipe_init(loop, &out_pipe, 0) ||
      uv_pipe_open(&out_pipe, 1) || uv_read_start((uv_stream_t *)&in_pipe, on_alloc, on_read)) {
    fprintf(stderr, "bare_responder: cannot open stdio\n");
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  free(line);
  return exit_code;
}
