/* agenthost — C client library for `agenthost sdk` (see agenthost/client.h).
 *
 * One private libuv loop runs on a background thread (the client thread) and owns every handle: the child
 * process, its three pipes, the JSON-RPC peer (host/jsonrpc.c, compiled into this library), timers. Other
 * threads never touch those: they post commands through a mutex-protected queue and a uv_async, and blocking
 * calls wait on a condition variable for the client thread to complete them. This keeps the peer's
 * single-thread contract (agenthost/jsonrpc.h) while the public API is usable from plain blocking programs.
 */
#include "agenthost/client.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "jsonrpc.h" /* the peer library (agenthost-jsonrpc) */
#include "record.h"  /* recordings (the same library) */
#include "usage.h"   /* the usage arithmetic (the same library) */

extern char **environ;

/* After the child's exit, how long to wait for its stderr to reach EOF (a grandchild may hold it open)
 * before reporting transport failures with what was read so far. */
#define STDERR_GRACE_MS 300
/* A blocking run() re-checks the transport this often while it waits for events. */
#define RUN_POLL_MS 50

typedef struct call call;
typedef struct cmd cmd;
typedef struct sub sub;

/* One request: created by the caller's thread, owned by the client thread once posted. */
struct call {
  call *prev;
  call *next;
  ah_client *c;
  char *method;
  json_t *params; /* until sent */
  uint64_t timeout_ms;
  int64_t id; /* -1 until sent */
  uv_timer_t timer;
  bool listed;
  bool awaiting_exit; /* the connection broke: completed as TRANSPORT once the exit is known */
  ah_client_response_fn cb;
  void *cb_data;
};

typedef enum cmd_kind {
  CMD_INVALID = 0,
  CMD_REQUEST,
  CMD_RESPOND,
  CMD_RESPOND_ERROR,
  CMD_CLOSE,
  CMD_STOP,
} cmd_kind;

struct cmd {
  cmd *next;
  cmd_kind kind;
  call *call;
  ah_client_inbound *inb;
  json_t *json; /* RESPOND: result; RESPOND_ERROR: data */
  int64_t code;
  char *message;
};

struct ah_client_inbound {
  ah_client *c;
  ah_rpc_inbound *req;
};

struct sub {
  sub *next;
  uint64_t id;
  char *method;
  ah_client_notify_fn cb;
  void *data;
  bool dead;
};

typedef enum close_step {
  CLOSE_NONE = 0,
  CLOSE_SHUTDOWN, /* waiting for the shutdown answer */
  CLOSE_EOF,      /* stdin closed, waiting for the exit */
  CLOSE_TERM,     /* SIGTERM sent */
  CLOSE_KILL,     /* SIGKILL sent */
  CLOSE_DONE,
} close_step;

struct ah_client {
  ah_recorder *recorder; /* opts.record_dir: this connection's recording (written on the client thread) */
  /* Options (copied, immutable after new). */
  char *binary;
  char **args;
  char *cwd;
  ah_client_env_mode env_mode;
  char **env;
  uint64_t timeout_ms;
  uint64_t close_step_ms;
  ah_client_stderr_fn on_stderr;
  ah_client_stderr_fn on_diagnostic;
  void *data;

  /* Shared state, guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cond;
  cmd *queue_head;
  cmd *queue_tail;
  bool closing; /* ah_client_close was called: no new requests */
  bool closed;  /* the close sequence ended */
  bool dead;    /* the child's exit was observed (or it never started): transport failure for new work */
  bool spawned; /* a child was started */
  char *spawn_error;
  pid_t pid;
  bool exited;
  int64_t exit_status;
  int term_signal;
  char *lines[AH_CLIENT_STDERR_LINES]; /* ring of stderr lines */
  size_t line_head;                    /* index of the oldest */
  size_t line_count;
  ah_client_request_fn on_request;
  void *on_request_data;

  /* Subscriptions, guarded by a recursive mutex: a callback may subscribe or unsubscribe. */
  pthread_mutex_t subs_mu;
  sub *subs;
  uint64_t next_sub_id;
  int dispatch_depth;

  /* Client thread only. */
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  uv_process_t proc;
  uv_pipe_t to_child;   /* the child's stdin */
  uv_pipe_t from_child; /* the child's stdout */
  uv_pipe_t err_pipe;   /* the child's stderr */
  uv_timer_t step_timer;
  uv_timer_t grace_timer;
  ah_rpc_peer *peer;
  bool peer_closing;
  bool peer_closed;
  bool err_done;
  bool to_child_closed;
  bool grace_over;
  call *calls; /* sent requests waiting for answers */
  char *err_partial;
  size_t err_partial_len;
  close_step step;
};

/* ---- small helpers ---------------------------------------------------------------------------------- */

static char *dupstr(const char *s) {
  return s ? strdup(s) : NULL;
}

static char **dupv(const char *const *v) {
  size_t n = 0;
  for (const char *const *p = v; p && *p; p++)
    n++;
  char **out = calloc(n + 1, sizeof *out);
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (!(out[i] = strdup(v[i]))) {
      for (size_t k = 0; k < i; k++)
        free(out[k]);
      free(out);
      return NULL;
    }
  return out;
}

static void freev(char **v) {
  for (char **p = v; p && *p; p++)
    free(*p);
  free(v);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0)
    s = NULL;
  va_end(ap);
  return s;
}

static bool on_client_thread(ah_client *c) {
  return pthread_equal(pthread_self(), c->thread);
}

void ah_client_error_clear(ah_client_error *err) {
  if (!err)
    return;
  free(err->method);
  free(err->message);
  json_decref(err->data);
  free(err->stderr_tail);
  memset(err, 0, sizeof *err);
  err->id = -1;
}

/* The kept stderr lines, "\n"-joined. Caller holds mu. */
static char *tail_locked(ah_client *c) {
  size_t len = 1;
  for (size_t i = 0; i < c->line_count; i++)
    len += strlen(c->lines[(c->line_head + i) % AH_CLIENT_STDERR_LINES]) + 1;
  char *s = malloc(len);
  if (!s)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < c->line_count; i++) {
    const char *l = c->lines[(c->line_head + i) % AH_CLIENT_STDERR_LINES];
    size_t n = strlen(l);
    memcpy(s + k, l, n);
    k += n;
    if (i + 1 < c->line_count)
      s[k++] = '\n';
  }
  s[k] = '\0';
  return s;
}

char *ah_client_stderr_tail(ah_client *c) {
  if (!c)
    return NULL;
  pthread_mutex_lock(&c->mu);
  char *s = tail_locked(c);
  pthread_mutex_unlock(&c->mu);
  return s;
}

/* Fill a TRANSPORT error with what is known of the child. */
static void err_transport(ah_client *c, ah_client_error *err, const char *method, int64_t id,
                          ah_client_outcome outcome, const char *msg) {
  pthread_mutex_lock(&c->mu);
  err->kind = AH_CLIENT_ERR_TRANSPORT;
  err->outcome = outcome;
  err->method = dupstr(method);
  err->id = id;
  err->exited = c->exited;
  err->exit_status = c->exit_status;
  err->term_signal = c->term_signal;
  err->stderr_tail = tail_locked(c);
  if (c->spawn_error)
    err->message = fmt("%s: %s", msg, c->spawn_error);
  else if (c->exited)
    err->message = fmt("%s (agenthost exited with status %lld, signal %d)", msg, (long long)c->exit_status,
                       c->term_signal);
  else
    err->message = dupstr(msg);
  pthread_mutex_unlock(&c->mu);
}

static void err_copy(ah_client_error *dst, const ah_client_error *src) {
  *dst = *src;
  dst->method = dupstr(src->method);
  dst->message = dupstr(src->message);
  dst->stderr_tail = dupstr(src->stderr_tail);
  /* A deep copy: the receiving thread then owns an object no other thread refers to. */
  dst->data = src->data ? json_deep_copy(src->data) : NULL;
}

/* ---- posting to the client thread --------------------------------------------------------------------- */

static void post(ah_client *c, cmd *k) {
  pthread_mutex_lock(&c->mu);
  if (c->queue_tail)
    c->queue_tail->next = k;
  else
    c->queue_head = k;
  c->queue_tail = k;
  pthread_mutex_unlock(&c->mu);
  uv_async_send(&c->wake);
}

/* ---- requests (client thread) ------------------------------------------------------------------------- */

static void call_free_cb(uv_handle_t *h) {
  call *k = h->data;
  free(k->method);
  json_decref(k->params);
  free(k);
}

static void call_unlist(call *k) {
  if (!k->listed)
    return;
  if (k->prev)
    k->prev->next = k->next;
  else
    k->c->calls = k->next;
  if (k->next)
    k->next->prev = k->prev;
  k->listed = false;
}

/* Complete a call: run its callback once, then release it. */
static void call_finish(call *k, int status, const json_t *result, const ah_client_error *err) {
  call_unlist(k);
  uv_timer_stop(&k->timer);
  if (k->cb)
    k->cb(k->c, status, result, err, k->cb_data);
  uv_close((uv_handle_t *)&k->timer, call_free_cb);
}

static void call_fail_transport(call *k, ah_client_outcome outcome, const char *msg) {
  ah_client_error e;
  memset(&e, 0, sizeof e);
  err_transport(k->c, &e, k->method, k->id, outcome, msg);
  call_finish(k, AH_ECLOSED, NULL, &e);
  ah_client_error_clear(&e);
}

static void call_timeout(uv_timer_t *t) {
  call *k = t->data;
  if (k->awaiting_exit) {
    call_fail_transport(k, AH_CLIENT_OUTCOME_UNKNOWN, "the connection to agenthost broke");
    return;
  }
  /* Abandon the local wait: a late answer is then one with an unknown id, logged and ignored. */
  if (k->c->peer)
    ah_rpc_forget(k->c->peer, k->id);
  ah_client_error e;
  memset(&e, 0, sizeof e);
  e.kind = AH_CLIENT_ERR_TIMEOUT;
  e.outcome = AH_CLIENT_OUTCOME_UNKNOWN;
  e.method = dupstr(k->method);
  e.id = k->id;
  e.message = fmt("no answer to %s (id %lld) within %llu ms: outcome unknown", k->method, (long long)k->id,
                  (unsigned long long)k->timeout_ms);
  call_finish(k, AH_ETIMEDOUT, NULL, &e);
  ah_client_error_clear(&e);
}

static void call_answered(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                          void *arg) {
  (void)peer;
  call *k = arg;
  if (status == 0) {
    call_finish(k, 0, result, NULL);
    return;
  }
  if (status == AH_EPROTO && error) {
    ah_client_error e;
    memset(&e, 0, sizeof e);
    e.kind = AH_CLIENT_ERR_RPC;
    e.outcome = AH_CLIENT_OUTCOME_FAILED;
    e.method = dupstr(k->method);
    e.id = k->id;
    json_t *code = json_object_get(error, "code");
    json_t *msg = json_object_get(error, "message");
    e.code = json_is_integer(code) ? json_integer_value(code) : 0;
    e.message = dupstr(json_is_string(msg) ? json_string_value(msg) : "");
    e.data = json_incref(json_object_get(error, "data"));
    call_finish(k, AH_EPROTO, NULL, &e);
    ah_client_error_clear(&e);
    return;
  }
  /* The connection closed before an answer: the exit status and stderr are reported once known. */
  pthread_mutex_lock(&k->c->mu);
  bool dead = k->c->dead;
  pthread_mutex_unlock(&k->c->mu);
  if (dead) {
    call_fail_transport(k, AH_CLIENT_OUTCOME_UNKNOWN, "the connection to agenthost broke");
    return;
  }
  k->awaiting_exit = true;
  uv_timer_start(&k->timer, call_timeout, k->timeout_ms, 0);
}

/* ---- the child ---------------------------------------------------------------------------------------- */

static void finalize_exit(ah_client *c);
static void close_check(ah_client *c);

static void push_line(ah_client *c, const char *line, size_t n) {
  char *l = malloc(n + 1);
  if (!l)
    return;
  memcpy(l, line, n);
  l[n] = '\0';
  pthread_mutex_lock(&c->mu);
  if (c->line_count == AH_CLIENT_STDERR_LINES) {
    free(c->lines[c->line_head]);
    c->lines[c->line_head] = NULL;
    c->line_head = (c->line_head + 1) % AH_CLIENT_STDERR_LINES;
    c->line_count--;
  }
  c->lines[(c->line_head + c->line_count) % AH_CLIENT_STDERR_LINES] = l;
  c->line_count++;
  pthread_mutex_unlock(&c->mu);
  if (c->on_stderr)
    c->on_stderr(c, l, c->data);
}

static void err_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static void err_closed(uv_handle_t *h) {
  ah_client *c = h->data;
  c->err_done = true;
  finalize_exit(c);
  close_check(c);
}

static void err_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  ah_client *c = s->data;
  if (n > 0) {
    size_t start = 0;
    for (size_t i = 0; i < (size_t)n; i++) {
      if (buf->base[i] != '\n')
        continue;
      if (c->err_partial_len) {
        size_t add = i - start;
        char *p = realloc(c->err_partial, c->err_partial_len + add);
        if (p) {
          memcpy(p + c->err_partial_len, buf->base + start, add);
          c->err_partial = p;
          push_line(c, p, c->err_partial_len + add);
        }
        free(c->err_partial);
        c->err_partial = NULL;
        c->err_partial_len = 0;
      } else {
        push_line(c, buf->base + start, i - start);
      }
      start = i + 1;
    }
    if (start < (size_t)n) {
      size_t add = (size_t)n - start;
      char *p = realloc(c->err_partial, c->err_partial_len + add);
      if (p) {
        memcpy(p + c->err_partial_len, buf->base + start, add);
        c->err_partial = p;
        c->err_partial_len += add;
      }
    }
  }
  free(buf->base);
  if (n < 0) {
    if (c->err_partial_len)
      push_line(c, c->err_partial, c->err_partial_len);
    free(c->err_partial);
    c->err_partial = NULL;
    c->err_partial_len = 0;
    uv_read_stop(s);
    if (!uv_is_closing((uv_handle_t *)s))
      uv_close((uv_handle_t *)s, err_closed);
  }
}

static void peer_closed(ah_rpc_peer *peer, void *arg) {
  (void)peer;
  ah_client *c = arg;
  c->peer_closed = true;
  if (!uv_is_closing((uv_handle_t *)&c->from_child))
    uv_close((uv_handle_t *)&c->from_child, NULL);
  if (!c->to_child_closed) {
    c->to_child_closed = true;
    uv_close((uv_handle_t *)&c->to_child, NULL);
  }
  close_check(c);
}

/* Stop talking to the child: close the peer (pending requests then get AH_ECLOSED) and its stdin (EOF). */
static void disconnect(ah_client *c) {
  if (c->peer && !c->peer_closing) {
    c->peer_closing = true;
    ah_recorder_mark(c->recorder, "stdio", "close", NULL);
    ah_rpc_close(c->peer, peer_closed, c);
  }
  if (!c->to_child_closed) {
    c->to_child_closed = true;
    uv_close((uv_handle_t *)&c->to_child, NULL);
  }
}

static void peer_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  ah_client *c = data;
  c->on_diagnostic(c, msg, c->data);
}

static void peer_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  ah_client *c = data;
  if (status != 0 && !c->peer_closing)
    ah_recorder_mark(c->recorder, "stdio", "loss", "the child's output broke");
  disconnect(data);
}

static void observe_line(void *arg, bool sent, const char *line, size_t len) {
  ah_recorder_message(((ah_client *)arg)->recorder, "stdio", sent, line, len, NULL);
}

/* The child is gone and its stderr read (or the grace passed): every broken call is a TRANSPORT error. */
static void finalize_exit(ah_client *c) {
  pthread_mutex_lock(&c->mu);
  bool ready = c->exited && (c->err_done || c->grace_over) && !c->dead;
  if (ready)
    c->dead = true;
  pthread_mutex_unlock(&c->mu);
  if (!ready)
    return;
  uv_timer_stop(&c->grace_timer);
  disconnect(c);
  for (call *k = c->calls, *next = NULL; k; k = next) {
    next = k->next;
    if (k->awaiting_exit)
      call_fail_transport(k, AH_CLIENT_OUTCOME_UNKNOWN, "the connection to agenthost broke");
  }
}

static void grace_over(uv_timer_t *t) {
  ah_client *c = t->data;
  c->grace_over = true;
  finalize_exit(c);
  close_check(c);
}

static void proc_exited(uv_process_t *p, int64_t status, int sig) {
  ah_client *c = p->data;
  pthread_mutex_lock(&c->mu);
  c->exited = true;
  c->exit_status = status;
  c->term_signal = sig;
  pthread_mutex_unlock(&c->mu);
  uv_close((uv_handle_t *)p, NULL);
  if (!c->err_done)
    uv_timer_start(&c->grace_timer, grace_over, STDERR_GRACE_MS, 0);
  finalize_exit(c);
  close_check(c);
}

static void notify_in(ah_rpc_peer *peer, const char *method, const json_t *params, void *data);
static void request_in(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data);

/* The child's environment per env_mode. */
static char **build_env(ah_client *c) {
  if (c->env_mode == AH_CLIENT_ENV_REPLACE) {
    size_t n = 0;
    for (char **p = c->env; p && *p; p++)
      n++;
    char **out = calloc(n + 1, sizeof *out);
    size_t k = 0;
    for (char **p = c->env; out && p && *p; p++)
      if (strchr(*p, '=') && !(out[k++] = strdup(*p))) {
        freev(out);
        return NULL;
      }
    return out;
  }
  size_t n = 0;
  for (char **p = environ; p && *p; p++)
    n++;
  for (char **p = c->env; p && *p; p++)
    n++;
  char **out = calloc(n + 1, sizeof *out);
  if (!out)
    return NULL;
  size_t k = 0;
  for (char **p = environ; p && *p; p++) {
    const char *eq = strchr(*p, '=');
    size_t len = eq ? (size_t)(eq - *p) : strlen(*p);
    bool overridden = false;
    for (char **x = c->env; x && *x && !overridden; x++) {
      const char *xe = strchr(*x, '=');
      size_t xl = xe ? (size_t)(xe - *x) : strlen(*x);
      overridden = xl == len && strncmp(*x, *p, len) == 0;
    }
    if (!overridden && !(out[k++] = strdup(*p)))
      goto nomem;
  }
  for (char **x = c->env; x && *x; x++)
    if (strchr(*x, '=') && !(out[k++] = strdup(*x)))
      goto nomem;
  return out;
nomem:
  freev(out);
  return NULL;
}

static void spawn_failed_closed(uv_handle_t *h) {
  (void)h;
}

/* Start the child once. Returns 0 or an error (then the client is dead: no respawn). */
static int ensure_spawned(ah_client *c) {
  pthread_mutex_lock(&c->mu);
  bool spawned = c->spawned;
  c->spawned = true;
  pthread_mutex_unlock(&c->mu);
  if (spawned)
    return c->peer && !c->peer_closing ? 0 : AH_ECLOSED;
  size_t nargs = 0;
  for (char **p = c->args; p && *p; p++)
    nargs++;
  char **argv = calloc(nargs + 3, sizeof *argv);
  char **env = build_env(c);
  if (!argv || !env) {
    free(argv);
    freev(env);
    pthread_mutex_lock(&c->mu);
    c->spawn_error = strdup("out of memory");
    c->dead = true;
    c->exited = false;
    pthread_mutex_unlock(&c->mu);
    return AH_ENOMEM;
  }
  /* agenthost parses its global options up to the first non-option: they go before the subcommand. */
  argv[0] = c->binary;
  for (size_t i = 0; i < nargs; i++)
    argv[i + 1] = c->args[i];
  argv[nargs + 1] = "sdk";
  uv_pipe_init(&c->loop, &c->to_child, 0);
  uv_pipe_init(&c->loop, &c->from_child, 0);
  uv_pipe_init(&c->loop, &c->err_pipe, 0);
  c->to_child.data = c->from_child.data = c->err_pipe.data = c;
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
  stdio[0].data.stream = (uv_stream_t *)&c->to_child;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&c->from_child;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&c->err_pipe;
  uv_process_options_t po;
  memset(&po, 0, sizeof po);
  po.exit_cb = proc_exited;
  po.file = c->binary;
  po.args = argv;
  po.env = env;
  po.cwd = c->cwd;
  po.stdio_count = 3;
  po.stdio = stdio;
  po.flags = UV_PROCESS_DETACHED; /* setsid(): its own session and process group, killed as a group */
  c->proc.data = c;
  int rc = uv_spawn(&c->loop, &c->proc, &po);
  free(argv);
  freev(env);
  if (rc) {
    pthread_mutex_lock(&c->mu);
    c->spawn_error = fmt("cannot start %s: %s", c->binary, uv_strerror(rc));
    c->dead = true;
    pthread_mutex_unlock(&c->mu);
    uv_close((uv_handle_t *)&c->proc, spawn_failed_closed);
    uv_close((uv_handle_t *)&c->to_child, NULL);
    uv_close((uv_handle_t *)&c->from_child, NULL);
    uv_close((uv_handle_t *)&c->err_pipe, NULL);
    c->to_child_closed = true;
    c->err_done = true;
    c->peer_closed = true;
    return AH_EIO;
  }
  pthread_mutex_lock(&c->mu);
  c->pid = c->proc.pid;
  pthread_mutex_unlock(&c->mu);
  uv_read_start((uv_stream_t *)&c->err_pipe, err_alloc, err_read);
  ah_rpc_opts ro;
  memset(&ro, 0, sizeof ro);
  ro.struct_size = sizeof ro;
  ro.on_request = request_in;
  ro.on_notification = notify_in;
  ro.on_eof = peer_eof;
  ro.on_log = c->on_diagnostic ? peer_log : NULL;
  ro.data = c;
  rc = ah_rpc_open((uv_stream_t *)&c->from_child, (uv_stream_t *)&c->to_child, &ro, &c->peer);
  if (rc == 0 && c->recorder) {
    ah_recorder_mark(c->recorder, "stdio", "open", c->binary);
    ah_rpc_observe(c->peer, observe_line, c);
  }
  if (rc) {
    c->peer = NULL;
    c->peer_closed = true;
    uv_close((uv_handle_t *)&c->from_child, NULL);
    c->to_child_closed = true;
    uv_close((uv_handle_t *)&c->to_child, NULL); /* EOF: the child ends on its own */
    return rc;
  }
  return 0;
}

/* ---- inbound traffic (client thread) ------------------------------------------------------------------- */

static void notify_in(ah_rpc_peer *peer, const char *method, const json_t *params, void *data) {
  (void)peer;
  ah_client *c = data;
  pthread_mutex_lock(&c->subs_mu);
  c->dispatch_depth++;
  for (sub *s = c->subs; s; s = s->next)
    if (!s->dead && (!s->method || strcmp(s->method, method) == 0))
      s->cb(c, method, params, s->data);
  c->dispatch_depth--;
  if (c->dispatch_depth == 0) {
    sub **pp = &c->subs;
    while (*pp) {
      sub *s = *pp;
      if (s->dead) {
        *pp = s->next;
        free(s->method);
        free(s);
      } else {
        pp = &s->next;
      }
    }
  }
  pthread_mutex_unlock(&c->subs_mu);
}

static void request_in(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  (void)peer;
  ah_client *c = data;
  pthread_mutex_lock(&c->mu);
  ah_client_request_fn cb = c->on_request;
  void *cb_data = c->on_request_data;
  pthread_mutex_unlock(&c->mu);
  if (!cb) {
    ah_rpc_respond_error(req, AH_RPC_METHOD_NOT_FOUND, "this client answers no server requests", NULL);
    return;
  }
  ah_client_inbound *in = malloc(sizeof *in);
  if (!in) {
    ah_rpc_respond_error(req, AH_RPC_INTERNAL_ERROR, "out of memory", NULL);
    return;
  }
  in->c = c;
  in->req = req;
  cb(c, in, method, params, cb_data);
}

/* ---- close sequence (client thread) -------------------------------------------------------------------- */

static void step_timeout(uv_timer_t *t);

static void close_advance(ah_client *c, close_step to) {
  c->step = to;
  uv_timer_stop(&c->step_timer);
  pid_t pid = c->pid;
  switch (to) {
  case CLOSE_EOF:
    disconnect(c);
    uv_timer_start(&c->step_timer, step_timeout, c->close_step_ms, 0);
    break;
  case CLOSE_TERM:
    kill(-pid, SIGTERM);
    uv_timer_start(&c->step_timer, step_timeout, c->close_step_ms, 0);
    break;
  case CLOSE_KILL:
    kill(-pid, SIGKILL);
    break;
  default:
    break;
  }
  close_check(c);
}

static void step_timeout(uv_timer_t *t) {
  ah_client *c = t->data;
  if (c->exited)
    return;
  if (c->step == CLOSE_SHUTDOWN)
    close_advance(c, CLOSE_EOF);
  else if (c->step == CLOSE_EOF)
    close_advance(c, CLOSE_TERM);
  else if (c->step == CLOSE_TERM)
    close_advance(c, CLOSE_KILL);
}

static void shutdown_answered(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                              void *arg) {
  (void)peer;
  (void)status;
  (void)result;
  (void)error;
  ah_client *c = arg;
  if (c->step == CLOSE_SHUTDOWN)
    close_advance(c, CLOSE_EOF);
}

/* The close ends when the exit was observed and every handle of the child is closed or closing. */
static void close_check(ah_client *c) {
  if (c->step == CLOSE_NONE || c->step == CLOSE_DONE)
    return;
  pthread_mutex_lock(&c->mu);
  bool spawned = c->spawned;
  bool gone = !spawned || (c->dead && (c->exited || c->spawn_error));
  pthread_mutex_unlock(&c->mu);
  if (!gone || (c->peer && !c->peer_closed))
    return;
  c->step = CLOSE_DONE;
  uv_timer_stop(&c->step_timer);
  uv_timer_stop(&c->grace_timer);
  pthread_mutex_lock(&c->mu);
  c->closed = true;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mu);
}

static void close_start(ah_client *c) {
  if (c->step != CLOSE_NONE)
    return;
  pthread_mutex_lock(&c->mu);
  bool spawned = c->spawned;
  bool dead = c->dead;
  pthread_mutex_unlock(&c->mu);
  if (!spawned || dead || !c->peer || c->peer_closing) {
    c->step = CLOSE_EOF;
    if (spawned && !c->exited && c->pid > 0) {
      close_advance(c, CLOSE_EOF);
      return;
    }
    close_check(c);
    return;
  }
  c->step = CLOSE_SHUTDOWN;
  uv_timer_start(&c->step_timer, step_timeout, c->close_step_ms, 0);
  if (ah_rpc_request(c->peer, "shutdown", NULL, shutdown_answered, c, NULL) != 0)
    close_advance(c, CLOSE_EOF);
}

/* ---- the client thread ----------------------------------------------------------------------------------
 */

static void run_call(ah_client *c, call *k) {
  uv_timer_init(&c->loop, &k->timer);
  k->timer.data = k;
  pthread_mutex_lock(&c->mu);
  bool closing = c->closing;
  bool dead = c->dead;
  pthread_mutex_unlock(&c->mu);
  if (closing) {
    call_fail_transport(k, AH_CLIENT_OUTCOME_FAILED, "the client is closed");
    return;
  }
  if (dead || ensure_spawned(c) != 0) {
    call_fail_transport(k, AH_CLIENT_OUTCOME_FAILED, "agenthost is not running");
    return;
  }
  json_t *params = k->params;
  k->params = NULL;
  int rc = ah_rpc_request(c->peer, k->method, params, call_answered, k, &k->id);
  if (rc) {
    call_fail_transport(k, AH_CLIENT_OUTCOME_FAILED, "cannot send the request");
    return;
  }
  k->listed = true;
  k->next = c->calls;
  if (c->calls)
    c->calls->prev = k;
  c->calls = k;
  uv_update_time(&c->loop);
  uv_timer_start(&k->timer, call_timeout, k->timeout_ms, 0);
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static void wake_cb(uv_async_t *a) {
  ah_client *c = a->data;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    cmd *k = c->queue_head;
    if (k) {
      c->queue_head = k->next;
      if (!c->queue_head)
        c->queue_tail = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (!k)
      return;
    switch (k->kind) {
    case CMD_REQUEST:
      run_call(c, k->call);
      break;
    case CMD_RESPOND:
      ah_rpc_respond(k->inb->req, k->json);
      free(k->inb);
      break;
    case CMD_RESPOND_ERROR:
      ah_rpc_respond_error(k->inb->req, (int)k->code, k->message ? k->message : "", k->json);
      free(k->inb);
      break;
    case CMD_CLOSE:
      close_start(c);
      break;
    case CMD_STOP:
      uv_walk(&c->loop, close_walk, NULL);
      break;
    case CMD_INVALID:
      break;
    }
    free(k->message);
    free(k);
  }
}

static void *thread_main(void *arg) {
  ah_client *c = arg;
  uv_run(&c->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* ---- public API -------------------------------------------------------------------------------------------
 */

static void client_free_memory(ah_client *c) {
  ah_recorder_close(c->recorder);
  free(c->binary);
  freev(c->args);
  free(c->cwd);
  freev(c->env);
  free(c->spawn_error);
  for (size_t i = 0; i < AH_CLIENT_STDERR_LINES; i++)
    free(c->lines[i]);
  free(c->err_partial);
  for (sub *s = c->subs, *n = NULL; s; s = n) {
    n = s->next;
    free(s->method);
    free(s);
  }
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->subs_mu);
  pthread_cond_destroy(&c->cond);
  free(c);
}

int ah_client_new(const ah_client_opts *opts, ah_client **out) {
  if (!out)
    return AH_EINVAL;
  *out = NULL;
  ah_client_opts o;
  memset(&o, 0, sizeof o);
  if (opts) {
    if (opts->struct_size < offsetof(ah_client_opts, reserved) || opts->struct_size > sizeof o)
      return AH_EINVAL;
    memcpy(&o, opts, opts->struct_size);
  }
  if (o.env_mode != AH_CLIENT_ENV_INVALID && o.env_mode != AH_CLIENT_ENV_MERGE &&
      o.env_mode != AH_CLIENT_ENV_REPLACE)
    return AH_EINVAL;
  ah_client *c = calloc(1, sizeof *c);
  if (!c)
    return AH_ENOMEM;
  const char *bin = o.binary;
  const char *env_bin = getenv("AGENTHOST_BIN");
  if (!bin)
    bin = env_bin && *env_bin ? env_bin : "agenthost";
  c->binary = strdup(bin);
  c->args = dupv(o.args);
  c->cwd = dupstr(o.cwd);
  c->env_mode = o.env_mode ? o.env_mode : AH_CLIENT_ENV_MERGE;
  c->env = dupv(o.env);
  c->timeout_ms = o.request_timeout_ms ? o.request_timeout_ms : AH_CLIENT_DEFAULT_TIMEOUT_MS;
  c->close_step_ms = o.close_step_ms ? o.close_step_ms : AH_CLIENT_DEFAULT_CLOSE_STEP_MS;
  c->on_stderr = o.on_stderr;
  c->on_diagnostic = o.on_diagnostic;
  c->data = o.data;
  c->next_sub_id = 1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cond, NULL);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&c->subs_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  if (!c->binary || !c->args || !c->env || (o.cwd && !c->cwd)) {
    client_free_memory(c);
    return AH_ENOMEM;
  }
  const char *record_dir =
      o.struct_size >= offsetof(ah_client_opts, record_dir) + sizeof o.record_dir ? o.record_dir : NULL;
  if (record_dir) {
    json_t *meta = json_pack("{s:i, s:s}", "protocol", AH_CLIENT_PROTOCOL_VERSION, "binary", c->binary);
    ah_recorder_opts ro = {.dir = record_dir, .source = "client:c", .side = "client", .meta = meta};
    char why[400] = "";
    int rrc = ah_recorder_open(&ro, &c->recorder, why, sizeof why);
    json_decref(meta);
    if (rrc != 0) {
      fprintf(stderr, "agenthost client: %s\n", why);
      client_free_memory(c);
      return AH_EIO;
    }
  }
  if (uv_loop_init(&c->loop) != 0) {
    client_free_memory(c);
    return AH_EIO;
  }
  uv_async_init(&c->loop, &c->wake, wake_cb);
  c->wake.data = c;
  uv_timer_init(&c->loop, &c->step_timer);
  c->step_timer.data = c;
  uv_timer_init(&c->loop, &c->grace_timer);
  c->grace_timer.data = c;
  /* The client thread writes to the child's stdin: with SIGPIPE blocked there, a write to a dead child fails
   * with EPIPE instead of killing the whole program. The thread inherits the mask; ours is restored. */
  sigset_t block;
  sigset_t old;
  sigemptyset(&block);
  sigaddset(&block, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  int rc = pthread_create(&c->thread, NULL, thread_main, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    uv_walk(&c->loop, close_walk, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    client_free_memory(c);
    return AH_EIO;
  }
  *out = c;
  return 0;
}

void *ah_client_data(const ah_client *c) {
  return c ? c->data : NULL;
}

pid_t ah_client_pid(ah_client *c) {
  if (!c)
    return 0;
  pthread_mutex_lock(&c->mu);
  pid_t pid = c->pid;
  pthread_mutex_unlock(&c->mu);
  return pid;
}

int ah_client_request_async(ah_client *c, const char *method, json_t *params, uint64_t timeout_ms,
                            ah_client_response_fn cb, void *data) {
  if (!c || !method) {
    json_decref(params);
    return AH_EINVAL;
  }
  pthread_mutex_lock(&c->mu);
  bool closing = c->closing;
  pthread_mutex_unlock(&c->mu);
  if (closing) {
    json_decref(params);
    return AH_ECLOSED;
  }
  call *k = calloc(1, sizeof *k);
  cmd *m = calloc(1, sizeof *m);
  if (!k || !m || !(k->method = strdup(method))) {
    free(k);
    free(m);
    json_decref(params);
    return AH_ENOMEM;
  }
  k->c = c;
  k->params = params;
  k->timeout_ms = timeout_ms ? timeout_ms : c->timeout_ms;
  k->id = -1;
  k->cb = cb;
  k->cb_data = data;
  m->kind = CMD_REQUEST;
  m->call = k;
  post(c, m);
  return 0;
}

/* A blocking caller's slot, filled by the client thread. */
typedef struct waiter {
  bool done;
  int status;
  json_t *result;
  ah_client_error err;
} waiter;

static void waiter_done(ah_client *c, int status, const json_t *result, const ah_client_error *err,
                        void *data) {
  waiter *w = data;
  /* A deep copy: the caller's thread then owns an object no other thread refers to. */
  json_t *copy = result ? json_deep_copy(result) : NULL;
  pthread_mutex_lock(&c->mu);
  w->status = status;
  w->result = copy;
  if (err)
    err_copy(&w->err, err);
  w->done = true;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->mu);
}

int ah_client_request(ah_client *c, const char *method, json_t *params, uint64_t timeout_ms, json_t **result,
                      ah_client_error *err) {
  if (err)
    ah_client_error_clear(err);
  if (result)
    *result = NULL;
  if (!c || !method) {
    json_decref(params);
    return AH_EINVAL;
  }
  if (on_client_thread(c)) {
    json_decref(params);
    return AH_ESTATE;
  }
  waiter w;
  memset(&w, 0, sizeof w);
  int rc = ah_client_request_async(c, method, params, timeout_ms, waiter_done, &w);
  if (rc == AH_ECLOSED) {
    if (err)
      err_transport(c, err, method, -1, AH_CLIENT_OUTCOME_FAILED, "the client is closed");
    return rc;
  }
  if (rc)
    return rc;
  pthread_mutex_lock(&c->mu);
  while (!w.done)
    pthread_cond_wait(&c->cond, &c->mu);
  pthread_mutex_unlock(&c->mu);
  if (result)
    *result = w.result;
  else
    json_decref(w.result);
  if (err)
    *err = w.err;
  else
    ah_client_error_clear(&w.err);
  return w.status;
}

static void err_protocol(ah_client_error *err, const char *method, const char *msg) {
  if (!err)
    return;
  ah_client_error_clear(err);
  err->kind = AH_CLIENT_ERR_PROTOCOL;
  err->outcome = AH_CLIENT_OUTCOME_FAILED;
  err->method = dupstr(method);
  err->message = dupstr(msg);
}

int ah_client_initialize(ah_client *c, const ah_client_init_opts *opts, json_t **result,
                         ah_client_error *err) {
  if (result)
    *result = NULL;
  if (err)
    ah_client_error_clear(err);
  ah_client_init_opts o;
  memset(&o, 0, sizeof o);
  if (opts) {
    if (opts->struct_size < offsetof(ah_client_init_opts, reserved) || opts->struct_size > sizeof o)
      return AH_EINVAL;
    memcpy(&o, opts, opts->struct_size);
  }
  if (!c)
    return AH_EINVAL;
  char cwd[4096];
  if (!o.cwd) {
    if (!getcwd(cwd, sizeof cwd))
      return AH_EIO;
    o.cwd = cwd;
  }
  json_t *p = json_pack("{s:s, s:i, s:{s:s, s:s}, s:{s:b}}", "cwd", o.cwd, "protocolVersion",
                        AH_CLIENT_PROTOCOL_VERSION, "clientInfo", "name",
                        o.client_name ? o.client_name : "agenthost-client-c", "version", "1", "capabilities",
                        "requests", o.answer_requests);
  if (!p)
    return AH_ENOMEM;
  if (o.provider)
    json_object_set_new(p, "provider", json_string(o.provider));
  if (o.model)
    json_object_set_new(p, "model", json_string(o.model));
  if (o.max_tokens > 0)
    json_object_set_new(p, "maxTokens", json_integer(o.max_tokens));
  json_t *res = NULL;
  int rc = ah_client_request(c, "initialize", p, 0, &res, err);
  if (rc)
    return rc;
  json_t *si = json_object_get(res, "serverInfo");
  if (!json_is_string(json_object_get(si, "name")) || !json_is_string(json_object_get(si, "version")) ||
      !json_is_integer(json_object_get(res, "protocolVersion"))) {
    json_decref(res);
    err_protocol(err, "initialize",
                 "initialize: serverInfo.name and serverInfo.version must be strings and protocolVersion an "
                 "integer");
    return AH_EPROTO;
  }
  if (result)
    *result = res;
  else
    json_decref(res);
  return 0;
}

int ah_client_prompt(ah_client *c, const char *session_id, const char *text, char **session_id_out,
                     char **message_id_out, ah_client_error *err) {
  if (session_id_out)
    *session_id_out = NULL;
  if (message_id_out)
    *message_id_out = NULL;
  if (!c || !text)
    return AH_EINVAL;
  json_t *p = json_pack("{s:s}", "text", text);
  if (!p)
    return AH_ENOMEM;
  if (session_id)
    json_object_set_new(p, "sessionId", json_string(session_id));
  json_t *res = NULL;
  int rc = ah_client_request(c, "session/prompt", p, 0, &res, err);
  if (rc)
    return rc;
  const char *sid = json_string_value(json_object_get(res, "sessionId"));
  const char *mid = json_string_value(json_object_get(res, "messageId"));
  if (!sid || !mid) {
    json_decref(res);
    err_protocol(err, "session/prompt", "session/prompt: the receipt lacks sessionId or messageId");
    return AH_EPROTO;
  }
  if (session_id_out)
    *session_id_out = strdup(sid);
  if (message_id_out)
    *message_id_out = strdup(mid);
  json_decref(res);
  return 0;
}

static int session_call(ah_client *c, const char *method, const char *session_id, ah_client_error *err) {
  if (err)
    ah_client_error_clear(err);
  if (!c || !session_id)
    return AH_EINVAL;
  json_t *p = json_pack("{s:s}", "sessionId", session_id);
  if (!p)
    return AH_ENOMEM;
  return ah_client_request(c, method, p, 0, NULL, err);
}

int ah_client_cancel(ah_client *c, const char *session_id, ah_client_error *err) {
  return session_call(c, "session/cancel", session_id, err);
}

int ah_client_close_session(ah_client *c, const char *session_id, ah_client_error *err) {
  return session_call(c, "session/close", session_id, err);
}

int ah_client_subscribe(ah_client *c, const char *method, ah_client_notify_fn cb, void *data,
                        uint64_t *sub_id) {
  if (!c || !cb)
    return AH_EINVAL;
  sub *s = calloc(1, sizeof *s);
  if (!s || (method && !(s->method = strdup(method)))) {
    free(s);
    return AH_ENOMEM;
  }
  s->cb = cb;
  s->data = data;
  pthread_mutex_lock(&c->subs_mu);
  s->id = c->next_sub_id++;
  /* Appended, so that subscriptions see notifications in the order they were made. */
  sub **pp = &c->subs;
  while (*pp)
    pp = &(*pp)->next;
  *pp = s;
  pthread_mutex_unlock(&c->subs_mu);
  if (sub_id)
    *sub_id = s->id;
  return 0;
}

int ah_client_unsubscribe(ah_client *c, uint64_t sub_id) {
  if (!c)
    return AH_EINVAL;
  int rc = AH_ENOENT;
  pthread_mutex_lock(&c->subs_mu);
  for (sub **pp = &c->subs; *pp; pp = &(*pp)->next) {
    sub *s = *pp;
    if (s->id != sub_id || s->dead)
      continue;
    if (c->dispatch_depth > 0) {
      s->dead = true; /* inside a dispatch on this thread: unlinked when it ends */
    } else {
      *pp = s->next;
      free(s->method);
      free(s);
    }
    rc = 0;
    break;
  }
  pthread_mutex_unlock(&c->subs_mu);
  return rc;
}

int ah_client_set_request_handler(ah_client *c, ah_client_request_fn cb, void *data) {
  if (!c)
    return AH_EINVAL;
  pthread_mutex_lock(&c->mu);
  c->on_request = cb;
  c->on_request_data = data;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

static int respond_any(ah_client_inbound *req, cmd_kind kind, json_t *json, int64_t code,
                       const char *message) {
  if (!req) {
    json_decref(json);
    return AH_EINVAL;
  }
  ah_client *c = req->c;
  if (on_client_thread(c)) {
    int rc = kind == CMD_RESPOND ? ah_rpc_respond(req->req, json)
                                 : ah_rpc_respond_error(req->req, (int)code, message ? message : "", json);
    free(req);
    return rc;
  }
  cmd *m = calloc(1, sizeof *m);
  if (!m || (message && !(m->message = strdup(message)))) {
    /* Without memory the answer cannot travel: the peer's handle would leak, so answer from here is not
     * possible either; report it. */
    free(m);
    json_decref(json);
    return AH_ENOMEM;
  }
  m->kind = kind;
  m->inb = req;
  m->json = json;
  m->code = code;
  post(c, m);
  return 0;
}

int ah_client_respond(ah_client_inbound *req, json_t *result) {
  return respond_any(req, CMD_RESPOND, result, 0, NULL);
}

int ah_client_respond_error(ah_client_inbound *req, int64_t code, const char *message, json_t *data) {
  return respond_any(req, CMD_RESPOND_ERROR, data, code, message);
}

/* ---- run() (SDK-TS-RUN) ------------------------------------------------------------------------------- */

typedef struct run_state {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  json_t *buffered; /* [[method, params], …] received before the receipt */
  bool receipt;
  char *sid;
  char *mid;
  bool started; /* the matching inbox/received was seen */
  bool done;
  bool proto_error;
  ah_client_run_result *out;
  /* ah_client_run_usage: every session's turns seen in the run, and the parent links */
  bool want_usage;
  json_t *turns; /* "sid\x1fturnId" → {sessionId, turnId, rounds:[usage], end?, model?, requestedModel?} */
  json_t *order; /* the keys, in the order the turns ended */
  json_t *parents; /* sessionId → parent sessionId (subagent/started) */
} run_state;

/* A turn's usage from its events (docs/usage.md): what the usage arithmetic needs to hold. */
static void run_usage_event(run_state *r, const char *sid, const json_t *ev) {
  const char *kind = json_string_value(json_object_get(ev, "kind"));
  const char *turn = json_string_value(json_object_get(ev, "turnId"));
  const json_t *d = json_object_get(ev, "data");
  if (!kind)
    return;
  if (strcmp(kind, "subagent/started") == 0 && json_is_string(json_object_get(d, "sessionId"))) {
    json_object_set_new(r->parents, json_string_value(json_object_get(d, "sessionId")), json_string(sid));
    return;
  }
  bool round = strcmp(kind, "model/usage") == 0, end = strcmp(kind, "turn/ended") == 0;
  if (!turn || !(round || end || strcmp(kind, "turn/started") == 0))
    return;
  char key[300];
  snprintf(key, sizeof key, "%.140s\x1f%.140s", sid, turn);
  json_t *t = json_object_get(r->turns, key);
  if (!t) {
    t = json_pack("{s:s, s:s, s:[]}", "sessionId", sid, "turnId", turn, "rounds");
    json_object_set_new(r->turns, key, t);
  }
  if (round) {
    json_array_append(json_object_get(t, "rounds"), json_object_get(d, "usage"));
  } else if (end) {
    json_object_set(t, "end", json_object_get(d, "usage"));
    json_array_append_new(r->order, json_string(key));
  }
  const char *asked = json_string_value(json_object_get(d, end || round ? "requestedModel" : "model"));
  if (asked)
    json_object_set_new(t, "requestedModel", json_string(asked));
}

/* Whether `sid` is the root or below it (by the subagent/started links seen). */
static bool run_in_tree(run_state *r, const char *sid) {
  const char *cur = sid;
  for (size_t step = 0; step <= json_object_size(r->parents) && cur; step++) {
    if (strcmp(cur, r->sid) == 0)
      return true;
    cur = json_string_value(json_object_get(r->parents, cur));
  }
  return false;
}

/* The run's usage: per turn (its round trips, else its end), the root's own, and the tree's. */
static void run_usage_fill(run_state *r, ah_client_run_usage *u) {
  size_t n = json_object_size(r->turns) + 1;
  json_t *sessions = json_object(); /* sid → tokens index */
  const char **ids = calloc(n, sizeof *ids), **parents = calloc(n, sizeof *parents);
  ah_tokens *own = calloc(n, sizeof *own);
  int64_t *turns_of = calloc(n, sizeof *turns_of);
  size_t ns = 0;
  u->turns = json_array();
  if (!sessions || !ids || !parents || !own || !turns_of || !u->turns)
    goto out;
  size_t i;
  json_t *k;
  json_array_foreach(r->order, i, k) {
    json_t *t = json_object_get(r->turns, json_string_value(k));
    const char *sid = json_string_value(json_object_get(t, "sessionId"));
    if (!run_in_tree(r, sid))
      continue; /* another prompt's, another client's */
    ah_tokens use = {0}, one;
    char err[120];
    size_t nr = json_array_size(json_object_get(t, "rounds"));
    const char *model = NULL;
    if (nr) {
      size_t j;
      json_t *ru;
      json_array_foreach(json_object_get(t, "rounds"), j, ru) {
        if (ah__tokens_from_json(ru, &one, err, sizeof err) == 0) {
          if (!json_object_get(ru, "requests"))
            one.requests = 1;
          ah__tokens_add(&use, &one);
        }
        model = json_string_value(json_object_get(ru, "model"));
      }
    } else if (ah__tokens_from_json(json_object_get(t, "end"), &one, err, sizeof err) == 0) {
      use = one;
      model = json_array_size(json_object_get(json_object_get(t, "end"), "models")) > 1
                  ? NULL
                  : json_string_value(json_object_get(json_object_get(t, "end"), "model"));
    }
    json_t *ix = json_object_get(sessions, sid);
    if (!ix) {
      ix = json_integer((json_int_t)ns);
      json_object_set_new(sessions, sid, ix);
      ids[ns] = sid;
      parents[ns] = json_string_value(json_object_get(r->parents, sid));
      ns++;
    }
    ah__tokens_add(&own[json_integer_value(ix)], &use);
    turns_of[json_integer_value(ix)]++;
    json_t *to =
        json_pack("{s:s, s:s?, s:O, s:o, s:i}", "sessionId", sid, "parent",
                  json_string_value(json_object_get(r->parents, sid)), "turnId", json_object_get(t, "turnId"),
                  "usage", ah__tokens_json(&use), "roundTrips", (int)nr);
    if (model)
      json_object_set_new(to, "model", json_string(model));
    if (json_object_get(t, "requestedModel"))
      json_object_set(to, "requestedModel", json_object_get(t, "requestedModel"));
    json_array_append_new(u->turns, to);
  }
  {
    ah_tokens root = {0}, tree;
    int64_t root_turns = 0, tree_turns = 0;
    json_t *rix = json_object_get(sessions, r->sid);
    if (rix) {
      root = own[json_integer_value(rix)];
      root_turns = turns_of[json_integer_value(rix)];
    }
    size_t counted = ah__usage_tree(ids, parents, own, ns, r->sid, &tree);
    for (size_t s = 0; s < ns; s++)
      tree_turns += turns_of[s];
    u->usage = ah__tokens_json(&root);
    json_object_set_new(u->usage, "turns", json_integer(root_turns));
    u->tree_usage = ah__tokens_json(&tree);
    json_object_set_new(u->tree_usage, "turns", json_integer(tree_turns));
    json_object_set_new(u->tree_usage, "sessions", json_integer((json_int_t)(counted ? counted : 1)));
  }
out:
  json_decref(sessions);
  free(ids);
  free(parents);
  free(own);
  free(turns_of);
}

static void run_process(run_state *r, const char *method, json_t *params) {
  if (r->done)
    return;
  const char *sid = json_string_value(json_object_get(params, "sessionId"));
  if (r->want_usage && sid && strcmp(method, "session.event") == 0 &&
      (r->started || strcmp(sid, r->sid) != 0))
    run_usage_event(r, sid, json_object_get(params, "event"));
  if (!sid || strcmp(sid, r->sid) != 0)
    return; /* another session (a subagent's, another prompt's): not part of this run's summary */
  if (strcmp(method, "session.event") == 0) {
    json_t *ev = json_object_get(params, "event");
    const char *kind = json_string_value(json_object_get(ev, "kind"));
    if (!kind) {
      r->proto_error = true;
      r->done = true;
      return;
    }
    if (!r->started) {
      const char *mid = json_string_value(json_object_get(ev, "messageId"));
      if (strcmp(kind, "inbox/received") != 0 || !mid || strcmp(mid, r->mid) != 0)
        return; /* before the matching receipt: dropped */
      r->started = true;
    }
    json_array_append(r->out->events, ev);
    json_t *d = json_object_get(ev, "data");
    if (strcmp(kind, "message/committed") == 0 && json_is_string(json_object_get(d, "text"))) {
      free(r->out->final_response);
      r->out->final_response = strdup(json_string_value(json_object_get(d, "text")));
    } else if (strcmp(kind, "inbox/cancelled") == 0 && json_is_string(json_object_get(ev, "messageId")) &&
               strcmp(json_string_value(json_object_get(ev, "messageId")), r->mid) == 0) {
      /* A close cancelled the prompt while it was queued: it will never run, the run ends now. */
      free(r->out->final_response);
      r->out->final_response = NULL;
      free(r->out->finish_reason);
      r->out->finish_reason = strdup("cancelled");
      r->done = true;
    } else if (strcmp(kind, "turn/ended") == 0) {
      const char *reason = json_string_value(json_object_get(d, "reason"));
      if (reason) {
        free(r->out->finish_reason);
        r->out->finish_reason = strdup(reason);
      }
      json_t *u = json_object_get(d, "usage");
      r->out->input_tokens += json_integer_value(json_object_get(u, "inputTokens"));
      r->out->output_tokens += json_integer_value(json_object_get(u, "outputTokens"));
    }
  } else if (strcmp(method, "session.status") == 0) {
    const char *st = json_string_value(json_object_get(params, "status"));
    if (r->started && st && strcmp(st, "idle") == 0)
      r->done = true;
  }
}

static void run_notified(ah_client *c, const char *method, const json_t *params, void *data) {
  (void)c;
  run_state *r = data;
  /* Copied on the client thread: the run then owns objects no other thread touches. */
  json_t *copy = params ? json_deep_copy(params) : json_object();
  if (!copy)
    return;
  pthread_mutex_lock(&r->mu);
  if (!r->receipt) {
    json_array_append_new(r->buffered, json_pack("[s,o]", method, copy));
  } else {
    run_process(r, method, copy);
    json_decref(copy);
    if (r->done)
      pthread_cond_broadcast(&r->cond);
  }
  pthread_mutex_unlock(&r->mu);
}

void ah_client_run_result_clear(ah_client_run_result *r) {
  if (!r)
    return;
  free(r->session_id);
  free(r->message_id);
  free(r->final_response);
  free(r->finish_reason);
  json_decref(r->events);
  memset(r, 0, sizeof *r);
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void ah_client_run_usage_clear(ah_client_run_usage *u) {
  if (!u)
    return;
  json_decref(u->usage);
  json_decref(u->tree_usage);
  json_decref(u->turns);
  u->usage = u->tree_usage = u->turns = NULL;
}

int ah_client_run(ah_client *c, const char *text, const char *session_id, uint64_t timeout_ms,
                  ah_client_run_result *out, ah_client_error *err) {
  return ah_client_run_with_usage(c, text, session_id, timeout_ms, out, NULL, err);
}

int ah_client_run_with_usage(ah_client *c, const char *text, const char *session_id, uint64_t timeout_ms,
                             ah_client_run_result *out, ah_client_run_usage *usage, ah_client_error *err) {
  if (err)
    ah_client_error_clear(err);
  if (!c || !text || !out || (usage && usage->struct_size < sizeof *usage))
    return AH_EINVAL;
  ah_client_run_result_clear(out);
  if (usage)
    ah_client_run_usage_clear(usage);
  if (on_client_thread(c))
    return AH_ESTATE;
  out->events = json_array();
  run_state r;
  memset(&r, 0, sizeof r);
  r.out = out;
  r.buffered = json_array();
  r.want_usage = usage != NULL;
  r.turns = json_object();
  r.order = json_array();
  r.parents = json_object();
  if (!out->events || !r.buffered || !r.turns || !r.order || !r.parents) {
    json_decref(r.buffered);
    json_decref(r.turns);
    json_decref(r.order);
    json_decref(r.parents);
    return AH_ENOMEM;
  }
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.cond, NULL);
  uint64_t start = mono_ms();
  uint64_t sub_event = 0;
  uint64_t sub_status = 0;
  /* Subscribe before sending, so that no event of this prompt can be missed. */
  int rc = ah_client_subscribe(c, "session.event", run_notified, &r, &sub_event);
  if (!rc)
    rc = ah_client_subscribe(c, "session.status", run_notified, &r, &sub_status);
  char *sid = NULL;
  char *mid = NULL;
  if (!rc)
    rc = ah_client_prompt(c, session_id, text, &sid, &mid, err);
  if (!rc) {
    pthread_mutex_lock(&r.mu);
    r.sid = sid;
    r.mid = mid;
    out->session_id = strdup(sid);
    out->message_id = strdup(mid);
    r.receipt = true;
    size_t i = 0;
    json_t *item = NULL;
    json_array_foreach(r.buffered, i, item) {
      run_process(&r, json_string_value(json_array_get(item, 0)), json_array_get(item, 1));
    }
    while (!r.done) {
      pthread_mutex_lock(&c->mu);
      bool dead = c->dead || c->closing;
      pthread_mutex_unlock(&c->mu);
      if (dead) {
        rc = AH_ECLOSED;
        break;
      }
      uint64_t now = mono_ms();
      if (timeout_ms && now - start >= timeout_ms) {
        rc = AH_ETIMEDOUT;
        break;
      }
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += RUN_POLL_MS * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&r.cond, &r.mu, &ts);
    }
    bool proto = r.proto_error;
    pthread_mutex_unlock(&r.mu);
    if (proto) {
      rc = AH_EPROTO;
      err_protocol(err, "session/prompt", "run: a session.event without a string kind");
    }
  }
  /* Unsubscribed with r.mu released: the callback may be waiting for it. */
  if (sub_event)
    ah_client_unsubscribe(c, sub_event);
  if (sub_status)
    ah_client_unsubscribe(c, sub_status);
  if (rc == AH_ECLOSED && err && err->kind == AH_CLIENT_ERR_NONE)
    err_transport(c, err, "session/prompt", -1, AH_CLIENT_OUTCOME_UNKNOWN,
                  "the connection to agenthost broke during run()");
  if (rc == AH_ETIMEDOUT && err && err->kind == AH_CLIENT_ERR_NONE) {
    err->kind = AH_CLIENT_ERR_TIMEOUT;
    err->outcome = AH_CLIENT_OUTCOME_UNKNOWN;
    err->method = dupstr("session/prompt");
    err->message = fmt("run() did not reach idle within %llu ms: the run goes on in the server",
                       (unsigned long long)timeout_ms);
  }
  if (usage && r.sid)
    run_usage_fill(&r, usage);
  free(sid);
  free(mid);
  json_decref(r.buffered);
  json_decref(r.turns);
  json_decref(r.order);
  json_decref(r.parents);
  pthread_mutex_destroy(&r.mu);
  pthread_cond_destroy(&r.cond);
  return rc;
}

/* ---- close and free ------------------------------------------------------------------------------------ */

int ah_client_close(ah_client *c, int64_t *exit_status, int *term_signal) {
  if (exit_status)
    *exit_status = 0;
  if (term_signal)
    *term_signal = 0;
  if (!c)
    return AH_EINVAL;
  if (on_client_thread(c))
    return AH_ESTATE;
  pthread_mutex_lock(&c->mu);
  bool first = !c->closing;
  c->closing = true;
  pthread_mutex_unlock(&c->mu);
  if (first) {
    cmd *m = calloc(1, sizeof *m);
    if (!m)
      return AH_ENOMEM;
    m->kind = CMD_CLOSE;
    post(c, m);
  }
  pthread_mutex_lock(&c->mu);
  while (!c->closed)
    pthread_cond_wait(&c->cond, &c->mu);
  if (exit_status)
    *exit_status = c->exit_status;
  if (term_signal)
    *term_signal = c->term_signal;
  pthread_mutex_unlock(&c->mu);
  return 0;
}

void ah_client_free(ah_client *c) {
  if (!c)
    return;
  ah_client_close(c, NULL, NULL);
  cmd *m = calloc(1, sizeof *m);
  if (m) {
    m->kind = CMD_STOP;
    post(c, m);
  } else {
    /* Without a command, stop the loop the hard way: it only holds closed or idle handles by now. */
    uv_stop(&c->loop);
  }
  pthread_join(c->thread, NULL);
  /* Commands posted after the stop (none when the caller kept the contract) are dropped. */
  for (cmd *k = c->queue_head, *n = NULL; k; k = n) {
    n = k->next;
    if (k->call) {
      json_decref(k->call->params);
      free(k->call->method);
      free(k->call);
    }
    json_decref(k->json);
    free(k->message);
    free(k->inb);
    free(k);
  }
  uv_loop_close(&c->loop);
  client_free_memory(c);
}
