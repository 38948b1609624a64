/* One command run to its end: see command.h. */
#include "command.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct out_buf {
  char *data;
  size_t len;
  size_t cap;
  char scratch[16384];
} out_buf;

typedef struct command_run {
  ah_host *host;
  ah_mount *core;
  ah_command_fn cb;
  void *arg;
  ah_cancel *cancel;
  size_t max_output;
  uint64_t grace_ms;
  uint64_t started;
  ah_process *proc;
  ah_timer *timer;
  ah_cancel_watch *cancel_watch;
  ah_cancel_watch *host_watch;
  char *input;
  uv_write_t write_req;
  bool killing;
  bool truncated;
  bool timed_out;
  bool cancelled;
  const char *error;
  out_buf out[2]; /* stdout, stderr */
  uv_timer_t later;
  void (*on_output)(void *arg, int stream, const char *data, size_t len);
  void *output_arg;
} command_run;

static void run_free(command_run *r) {
  free(r->input);
  free(r->out[0].data);
  free(r->out[1].data);
  free(r);
}

static void report(command_run *r, int64_t exit_status, int term_signal) {
  ah_command_result res = {
      .error = r->error,
      .exit_code = r->error ? 0 : exit_status,
      .signal = r->error ? 0 : term_signal,
      .out = r->out[0].data ? r->out[0].data : "",
      .out_len = r->out[0].len,
      .err = r->out[1].data ? r->out[1].data : "",
      .err_len = r->out[1].len,
      .truncated = r->truncated,
      .timed_out = r->timed_out,
      .cancelled = r->cancelled,
  };
  uv_update_time(ah__host_loop(r->host));
  res.duration_ms = uv_now(ah__host_loop(r->host)) - r->started;
  r->cb(&res, r->arg);
}

static void later_closed(uv_handle_t *h) {
  run_free(h->data);
}

static void later_fired(uv_timer_t *t) {
  command_run *r = t->data;
  report(r, 0, 0);
  uv_close((uv_handle_t *)t, later_closed);
}

/* An outcome known before the child started: reported on a later loop turn, never from inside
 * ah__command_run. */
static void report_later(command_run *r) {
  uv_timer_init(ah__host_loop(r->host), &r->later);
  r->later.data = r;
  uv_timer_start(&r->later, later_fired, 0, 0);
}

static command_run *run_of_stream(uv_stream_t *s, int *which) {
  ah_process *p = ah__process_of_stream(s);
  *which = s == ah__process_stdout(p) ? 0 : 1;
  return ah__process_arg(p);
}

static void out_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  int which = 0;
  command_run *r = run_of_stream((uv_stream_t *)h, &which);
  buf->base = r->out[which].scratch;
  buf->len = sizeof r->out[which].scratch;
}

static void out_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  int which = 0;
  command_run *r = run_of_stream(s, &which);
  out_buf *o = &r->out[which];
  if (nread < 0) {
    uv_read_stop(s); /* EOF or a read error: the process service closes the pipe */
    return;
  }
  size_t n = (size_t)nread;
  size_t room = r->max_output - o->len;
  if (n > room) {
    r->truncated = true; /* keep reading (so the child does not block) and discard */
    n = room;
  }
  if (n == 0)
    return;
  if (o->len + n > o->cap) {
    size_t ncap = o->cap ? o->cap : 4096;
    while (ncap < o->len + n)
      ncap *= 2;
    if (ncap > r->max_output)
      ncap = r->max_output;
    char *grown = realloc(o->data, ncap);
    if (!grown) {
      r->truncated = true;
      return;
    }
    o->data = grown;
    o->cap = ncap;
  }
  memcpy(o->data + o->len, buf->base, n);
  o->len += n;
  if (r->on_output)
    r->on_output(r->output_arg, which, buf->base, n);
}

static void kill_group(command_run *r, uint64_t grace_ms) {
  if (r->proc->exited)
    return;
  if (r->killing && grace_ms > 0)
    return; /* a kill is already escalating */
  r->killing = true;
  ah__process_kill(r->proc, grace_ms);
}

static void on_timeout(ah_timer *t, void *arg) {
  (void)t;
  command_run *r = arg;
  r->timer = NULL; /* a one-shot timer is freed by the host after this callback */
  if (r->proc->exited)
    return;
  r->timed_out = true;
  kill_group(r, r->grace_ms);
}

static void on_cancel(ah_cancel *token, void *arg) {
  (void)token;
  command_run *r = arg;
  r->cancel_watch = NULL; /* a fired watch is gone */
  if (r->proc->exited)
    return;
  r->cancelled = true;
  kill_group(r, r->grace_ms);
}

/* The core's token trips when the host stops: no grace, the host is waiting for this exit. */
static void on_host_stop(ah_cancel *token, void *arg) {
  (void)token;
  command_run *r = arg;
  r->host_watch = NULL;
  if (r->proc->exited)
    return;
  r->cancelled = true;
  kill_group(r, 0);
}

static void input_written(uv_write_t *req, int status) {
  (void)status; /* a child that exits without reading its input gets EPIPE: its exit says the rest */
  command_run *r = req->data;
  ah__process_close_stdin(r->proc);
}

static void command_exited(ah_process *p, int64_t exit_status, int term_signal, void *arg) {
  (void)p;
  command_run *r = arg;
  ah_mount *core = r->core;
  if (r->timer)
    ah__services_timer_stop(r->timer);
  r->timer = NULL;
  ah__cancel_unwatch(r->cancel_watch);
  r->cancel_watch = NULL;
  ah__cancel_unwatch(r->host_watch);
  r->host_watch = NULL;
  report(r, exit_status, term_signal);
  run_free(r);
  ah__mount_release(core, AH__HOLD_CALL); /* the run held the core's withdraw like a call */
}

int ah__command_run(ah_host *h, const ah_command_opts *o, ah_command_fn cb, void *arg) {
  if (!h || !o || !o->argv || !o->argv[0] || !o->cwd || !cb)
    return AH_EINVAL;
  command_run *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  r->host = h;
  r->core = ah__host_core_mount(h);
  r->cb = cb;
  r->arg = arg;
  r->cancel = o->cancel;
  r->max_output = o->max_output ? o->max_output : 64 * 1024;
  r->grace_ms = o->kill_grace_ms;
  r->on_output = o->on_output;
  r->output_arg = o->output_arg;
  uv_update_time(ah__host_loop(h));
  r->started = uv_now(ah__host_loop(h));
  if (o->input) {
    r->input = malloc(o->input_len ? o->input_len : 1);
    if (!r->input) {
      free(r);
      return AH_ENOMEM;
    }
    memcpy(r->input, o->input, o->input_len);
  }
  if (!r->core) {
    r->error = "the host is stopping";
    report_later(r);
    return 0;
  }
  if (ah__cancel_tripped(o->cancel)) {
    r->cancelled = true;
    r->error = "cancelled";
    report_later(r);
    return 0;
  }
  ah_process_opts po;
  memset(&po, 0, sizeof po);
  po.struct_size = sizeof po;
  po.file = o->argv[0];
  po.args = o->argv;
  po.env = o->env; /* after the allowlist, and nothing else of the host's environment */
  po.cwd = o->cwd;
  po.pipe_stdin = o->input != NULL;
  po.pipe_stdout = true;
  po.pipe_stderr = true;
  po.on_exit = command_exited;
  po.arg = r;
  ah_process *p = NULL;
  int rc = ah__services_spawn(r->core, &po, &p);
  if (rc == AH_ENOMEM) {
    run_free(r);
    return rc;
  }
  if (rc) {
    r->error = rc == AH_ESTATE   ? "the host is stopping"
               : rc == AH_ENOENT ? "the program or the working directory does not exist"
                                 : "the command could not be started";
    report_later(r);
    return 0;
  }
  r->proc = p;
  ah__mount_hold(r->core, AH__HOLD_CALL); /* a stopping host drains it before it goes on */
  for (int i = 0; i < 2; i++) {
    uv_stream_t *s = i == 0 ? ah__process_stdout(p) : ah__process_stderr(p);
    if (uv_read_start(s, out_alloc, out_read) != 0) {
      r->cancelled = true;
      kill_group(r, 0);
      return 0;
    }
  }
  if (o->input) {
    uv_buf_t b = uv_buf_init(r->input, (unsigned)o->input_len);
    r->write_req.data = r;
    uv_stream_t *in = (uv_stream_t *)&p->pipes[0];
    if (uv_write(&r->write_req, in, &b, 1, input_written) != 0)
      ah__process_close_stdin(p);
  }
  if (o->timeout_ms && ah__services_timer_start(r->core, o->timeout_ms, 0, on_timeout, r, &r->timer) != 0) {
    r->timer = NULL;
    r->cancelled = true;
    kill_group(r, 0);
    return 0;
  }
  if (o->cancel) {
    rc = ah__cancel_watch(o->cancel, on_cancel, r, &r->cancel_watch);
    if (rc) {
      r->cancel_watch = NULL;
      r->cancelled = true;
      kill_group(r, rc == AH_ECANCELED ? r->grace_ms : 0);
    }
  }
  if (ah__cancel_watch(r->core->token, on_host_stop, r, &r->host_watch) != 0) {
    r->host_watch = NULL;
    r->cancelled = true;
    kill_group(r, 0);
  }
  return 0;
}
