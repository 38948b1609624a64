/* Child processes for plugins and tools: one environment policy (an allowlist plus explicit variables,
 * SECURITY.md G10), an own process group, pipes owned by the host, and a kill that escalates from SIGTERM
 * to SIGKILL on the whole group and is done only when the exit has been observed. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern char **environ;

static const char *const allow_names[] = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM",
                                          "USER", "LANG",    "TZ",   "TMPDIR"};

static bool allowed(const char *entry) {
  const char *eq = strchr(entry, '=');
  if (!eq || eq == entry)
    return false;
  size_t n = (size_t)(eq - entry);
  if (strncmp(eq + 1, "()", 2) == 0)
    return false; /* an exported shell function */
  if (n > 3 && strncmp(entry, "LC_", 3) == 0)
    return true;
  for (size_t i = 0; i < sizeof allow_names / sizeof allow_names[0]; i++)
    if (strlen(allow_names[i]) == n && strncmp(entry, allow_names[i], n) == 0)
      return true;
  return false;
}

static bool same_name(const char *a, const char *b) {
  const char *ea = strchr(a, '=');
  const char *eb = strchr(b, '=');
  size_t na = ea ? (size_t)(ea - a) : strlen(a);
  size_t nb = eb ? (size_t)(eb - b) : strlen(b);
  return na == nb && strncmp(a, b, na) == 0;
}

char **ah__child_env(char *const *parent, const char *const *extra) {
  if (!parent)
    parent = environ;
  size_t n = 0;
  for (char *const *p = parent; p && *p; p++)
    n++;
  for (const char *const *p = extra; p && *p; p++)
    n++;
  char **env = calloc(n + 1, sizeof *env);
  if (!env)
    return NULL;
  size_t k = 0;
  for (char *const *p = parent; p && *p; p++) {
    if (!allowed(*p))
      continue;
    bool overridden = false;
    for (const char *const *x = extra; x && *x; x++)
      if (strchr(*x, '=') && same_name(*p, *x))
        overridden = true;
    if (!overridden && !(env[k++] = strdup(*p)))
      goto nomem;
  }
  for (const char *const *x = extra; x && *x; x++) {
    const char *eq = strchr(*x, '=');
    if (!eq || eq == *x || strncmp(eq + 1, "()", 2) == 0)
      continue; /* malformed or a shell function: dropped */
    if (!(env[k++] = strdup(*x)))
      goto nomem;
  }
  return env;
nomem:
  ah__child_env_free(env);
  return NULL;
}

void ah__child_env_free(char **env) {
  for (char **p = env; p && *p; p++)
    free(*p);
  free(env);
}

/* ---- stderr_to_log: the child's stderr as lines on the host's log ---- */

#define ERR_LOG_MAX ((size_t)64 * 1024)

static void err_flush(ah_process *p) {
  if (p->err_len == 0 && !p->err_cut)
    return;
  if (p->err_total < ERR_LOG_MAX)
    ah__log(AH_LOG_INFO, p->mount ? p->mount->name : "process", "%s[%d]: %.*s%s", p->err_tag, p->pid,
            (int)p->err_len, p->err_line, p->err_cut ? " (cut)" : "");
  else if (p->err_total - p->err_len < ERR_LOG_MAX)
    ah__log(AH_LOG_INFO, p->mount ? p->mount->name : "process",
            "%s[%d]: more than %zu bytes on stderr: the rest is not logged", p->err_tag, p->pid, ERR_LOG_MAX);
  p->err_len = 0;
  p->err_cut = false;
}

static void err_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  static _Thread_local char chunk[4096]; /* the loop thread's; consumed before the next read */
  buf->base = chunk;
  buf->len = sizeof chunk;
}

static void err_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  ah_process *p = s->data;
  if (nread < 0) {
    err_flush(p);
    uv_read_stop(s);
    return;
  }
  for (ssize_t i = 0; i < nread; i++) {
    char ch = buf->base[i];
    p->err_total++;
    if (ch == '\n')
      err_flush(p);
    else if (p->err_len < sizeof p->err_line)
      p->err_line[p->err_len++] = ch;
    else
      p->err_cut = true;
  }
}

static void maybe_finish(ah_process *p) {
  if (p->open_handles > 0)
    return;
  ah_mount *m = p->mount;
  /* Out of the mount's list first: on_exit may finish the plugin's withdraw (its done()), and the host must
   * not then take this process, which is already over, for one the plugin left behind. */
  ah__list_remove(&p->link);
  if (!p->orphaned && p->on_exit)
    p->on_exit(p, p->exit_status, p->term_signal, p->arg);
  free(p->err_tag);
  free(p);
  ah__mount_release(m, AH__HOLD_CLOSE);
}

static void handle_closed(uv_handle_t *h) {
  ah_process *p = h->data;
  p->open_handles--;
  maybe_finish(p);
}

static void close_pipe(ah_process *p, int i) {
  if (p->has_pipe[i] && !uv_is_closing((uv_handle_t *)&p->pipes[i]))
    uv_close((uv_handle_t *)&p->pipes[i], handle_closed);
}

/* After the exit, output can still sit in the pipes: a pipe that is being read stays open until its
 * reader stops (at EOF), for at most a second, so the tail of the output is not lost. Looked at after every
 * loop iteration's I/O (a check handle: the pipe closes in the iteration that read its EOF, not at the next
 * tick of a timer), with a timer for the second. */
static void drain_step(ah_process *p, bool deadline) {
  bool waiting = false;
  for (int i = 1; i < 3; i++) {
    if (!p->has_pipe[i] || uv_is_closing((uv_handle_t *)&p->pipes[i]))
      continue;
    if (uv_is_active((uv_handle_t *)&p->pipes[i]) && !deadline)
      waiting = true;
    else
      close_pipe(p, i);
  }
  if (!waiting) {
    if (!uv_is_closing((uv_handle_t *)&p->drain_timer)) {
      uv_timer_stop(&p->drain_timer);
      uv_close((uv_handle_t *)&p->drain_timer, handle_closed);
    }
    if (!uv_is_closing((uv_handle_t *)&p->drain_check)) {
      uv_check_stop(&p->drain_check);
      uv_close((uv_handle_t *)&p->drain_check, handle_closed);
    }
  }
}

static void drain_checked(uv_check_t *c) {
  drain_step(c->data, false);
}

static void drain_deadline(uv_timer_t *t) {
  drain_step(t->data, true);
}

static void proc_exited(uv_process_t *h, int64_t status, int sig) {
  ah_process *p = h->data;
  p->exited = true;
  p->exit_status = status;
  p->term_signal = sig;
  /* A kill in progress goes on: members of the group that ignore SIGTERM still get SIGKILL when the
   * grace period ends, even though the leader is gone. */
  if (p->kill_timer_used && !uv_is_active((uv_handle_t *)&p->kill_timer))
    uv_close((uv_handle_t *)&p->kill_timer, handle_closed);
  close_pipe(p, 0);
  uv_close((uv_handle_t *)&p->handle, handle_closed);
  uv_timer_init(h->loop, &p->drain_timer);
  p->drain_timer.data = p;
  uv_check_init(h->loop, &p->drain_check);
  p->drain_check.data = p;
  p->open_handles += 2;
  uv_timer_start(&p->drain_timer, drain_deadline, 1000, 0);
  uv_check_start(&p->drain_check, drain_checked);
  drain_step(p, false);
}

int ah__spawn(ah_host *h, ah_mount *m, const ah_process_opts *opts, ah_process **out) {
  if (!opts || opts->struct_size < offsetof(ah_process_opts, reserved) || !opts->file || !opts->args ||
      !opts->args[0] || !opts->on_exit || !out)
    return AH_EINVAL;
  if (opts->cwd && opts->cwd[0] != '/')
    return AH_EINVAL;
  ah_process *p = calloc(1, sizeof *p);
  if (!p)
    return AH_ENOMEM;
  char **env = ah__child_env(NULL, opts->env);
  if (!env) {
    free(p);
    return AH_ENOMEM;
  }
  p->mount = m;
  p->on_exit = opts->on_exit;
  p->arg = opts->arg;
  p->err_logged = AH_HAS_FIELD(opts, ah_process_opts, stderr_to_log) && opts->stderr_to_log;
  if (p->err_logged) {
    const char *tag =
        AH_HAS_FIELD(opts, ah_process_opts, log_tag) && opts->log_tag ? opts->log_tag : opts->file;
    const char *slash = strrchr(tag, '/');
    if (!(p->err_tag = strdup(slash && tag == opts->file ? slash + 1 : tag))) {
      ah__child_env_free(env);
      free(p);
      return AH_ENOMEM;
    }
  }
  uv_stdio_container_t stdio[3];
  bool want[3] = {opts->pipe_stdin, opts->pipe_stdout, opts->pipe_stderr || p->err_logged};
  for (int i = 0; i < 3; i++) {
    if (want[i]) {
      uv_pipe_init(h->loop, &p->pipes[i], 0);
      p->pipes[i].data = p;
      p->has_pipe[i] = true;
      stdio[i].flags = UV_CREATE_PIPE | (i == 0 ? UV_READABLE_PIPE : UV_WRITABLE_PIPE);
      stdio[i].data.stream = (uv_stream_t *)&p->pipes[i];
    } else if (i == 2) {
      stdio[i].flags = UV_INHERIT_FD;
      stdio[i].data.fd = 2;
    } else {
      stdio[i].flags = UV_IGNORE;
    }
  }
  uv_process_options_t po;
  memset(&po, 0, sizeof po);
  po.exit_cb = proc_exited;
  po.file = opts->file;
  po.args = (char **)opts->args;
  po.env = env;
  po.cwd = opts->cwd;
  po.stdio_count = 3;
  po.stdio = stdio;
  po.flags = UV_PROCESS_DETACHED; /* setsid(): its own session and process group */
  p->handle.data = p;
  int rc = uv_spawn(h->loop, &p->handle, &po);
  ah__child_env_free(env);
  if (rc) {
    AH_LOG_W("process", "cannot start %s: %s", opts->file, uv_strerror(rc));
    /* uv_spawn initialised the handle; close it and the pipes, then free in the callbacks. */
    p->orphaned = true;
    p->open_handles = 1;
    for (int i = 0; i < 3; i++)
      if (p->has_pipe[i]) {
        p->open_handles++;
        uv_close((uv_handle_t *)&p->pipes[i], handle_closed);
      }
    uv_close((uv_handle_t *)&p->handle, handle_closed);
    ah__list_init(&p->link);
    ah__mount_hold(m, AH__HOLD_CLOSE);
    return rc == UV_ENOENT ? AH_ENOENT : AH_EIO;
  }
  p->pid = p->handle.pid;
  if (p->err_logged)
    uv_read_start((uv_stream_t *)&p->pipes[2], err_alloc, err_read);
  p->open_handles = 1;
  for (int i = 0; i < 3; i++)
    if (p->has_pipe[i])
      p->open_handles++;
  ah__list_push(&m->procs, &p->link);
  ah__mount_hold(m, AH__HOLD_CLOSE); /* released when the process and its pipes are closed */
  *out = p;
  return 0;
}

/* A kill in progress polls the process group: it is done as soon as the group is empty (no need to sit
 * out the grace period when everything left on SIGTERM), SIGKILLs what is left when the grace ends, and
 * gives up watching a second after that. */
#define KILL_POLL_MS 20

static void kill_done(ah_process *p) {
  uv_timer_stop(&p->kill_timer);
  if (p->exited && !uv_is_closing((uv_handle_t *)&p->kill_timer))
    uv_close((uv_handle_t *)&p->kill_timer, handle_closed);
}

/* Whether any member of process group `pgid` is still alive. Zombies do not count: an orphan waits to be
 * reaped by whoever adopted it, which may take a while, but it no longer runs. */
static bool group_alive(pid_t pgid) {
  if (kill(-pgid, 0) != 0 && errno == ESRCH)
    return false;
  DIR *d = opendir("/proc");
  if (!d)
    return true;
  bool alive = false;
  struct dirent *e = NULL;
  while (!alive && (e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9')
      continue;
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "re");
    if (!f)
      continue;
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the command name may contain anything, even ')' */
    char state = 0;
    int ppid = 0;
    int pgrp = 0;
    if (rp && sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid && state != 'Z')
      alive = true;
  }
  closedir(d);
  return alive;
}

static void kill_tick(uv_timer_t *t) {
  ah_process *p = t->data;
  uint64_t now = uv_now(t->loop);
  bool empty = !group_alive(p->pid);
  if (empty && p->exited) {
    kill_done(p);
    return;
  }
  if (!p->kill_sent && now >= p->kill_deadline) {
    kill(-p->pid, SIGKILL);
    p->kill_sent = true;
  }
  if (p->kill_sent && p->exited && now >= p->kill_deadline + 1000)
    kill_done(p); /* members that cannot die (stopped in the kernel) are not waited for forever */
}

int ah__process_kill(ah_process *p, uint64_t grace_ms) {
  if (!p)
    return AH_EINVAL;
  if (p->exited)
    return 0;
  if (grace_ms == 0) {
    kill(-p->pid, SIGKILL);
    return 0;
  }
  kill(-p->pid, SIGTERM);
  if (!p->kill_timer_used) {
    uv_timer_init(p->handle.loop, &p->kill_timer);
    p->kill_timer.data = p;
    p->kill_timer_used = true;
    p->open_handles++;
  }
  /* The loop's cached time may be stale (a long callback, or a caller outside the loop): refresh it so
   * that the grace really lasts grace_ms. */
  uv_update_time(p->handle.loop);
  p->kill_deadline = uv_now(p->handle.loop) + grace_ms;
  p->kill_sent = false;
  uv_timer_start(&p->kill_timer, kill_tick, KILL_POLL_MS, KILL_POLL_MS);
  return 0;
}

void ah__process_close_stdin(ah_process *p) {
  if (p && p->has_pipe[0] && !uv_is_closing((uv_handle_t *)&p->pipes[0]))
    uv_close((uv_handle_t *)&p->pipes[0], handle_closed);
}
