#include "support.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char *ts_mkdtemp(void) {
  const char *base = getenv("TMPDIR");
  char *tmpl = NULL;
  if (asprintf(&tmpl, "%s/agenthost-test-XXXXXX", base && *base ? base : "/tmp") < 0)
    return NULL;
  if (!mkdtemp(tmpl)) {
    free(tmpl);
    return NULL;
  }
  chmod(tmpl, 0700);
  return tmpl;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

void ts_rmtree(const char *path) {
  if (path)
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

char *ts_write_file(const char *dir, const char *name, const char *text) {
  char *path = NULL;
  if (asprintf(&path, "%s/%s", dir, name) < 0)
    return NULL;
  FILE *f = fopen(path, "w");
  if (!f) {
    free(path);
    return NULL;
  }
  fputs(text, f);
  fclose(f);
  return path;
}

uint64_t ts_now_ms(void) {
  struct timespec ts = {0};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool flag_pred(void *arg) {
  return *(volatile bool *)arg;
}

bool ts_run_until(uv_loop_t *loop, volatile bool *flag, uint64_t timeout_ms) {
  return ts_run_until_pred(loop, flag_pred, (void *)flag, timeout_ms);
}

static void noop_timer(uv_timer_t *t) {
  (void)t;
}

bool ts_run_until_pred(uv_loop_t *loop, bool (*pred)(void *arg), void *arg, uint64_t timeout_ms) {
  /* A repeating 5 ms timer keeps UV_RUN_ONCE from blocking forever when nothing else is pending. */
  uv_timer_t tick;
  uv_timer_init(loop, &tick);
  uv_timer_start(&tick, noop_timer, 5, 5);
  uint64_t deadline = ts_now_ms() + timeout_ms;
  bool ok = pred(arg);
  while (!ok && ts_now_ms() < deadline) {
    uv_run(loop, UV_RUN_ONCE);
    ok = pred(arg);
  }
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return ok;
}

int ts_loop_close(uv_loop_t *loop) {
  /* Let pending close callbacks and requests finish, but close nothing on the code's behalf: a handle
   * left open is a bug the test must see as uv_loop_close() == UV_EBUSY. */
  uint64_t deadline = ts_now_ms() + 2000;
  while (uv_loop_alive(loop) && ts_now_ms() < deadline)
    uv_run(loop, UV_RUN_NOWAIT);
  return uv_loop_close(loop);
}

const char *ts_plugin(const char *name) {
  static char buf[4096];
  const char *dir = getenv("AH_TEST_PLUGIN_DIR");
  snprintf(buf, sizeof buf, "%s/%s.so", dir && *dir ? dir : AH_TEST_PLUGIN_DIR, name);
  return buf;
}

int ts_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e = NULL;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n - 1; /* the directory's own fd */
}

/* ---- child processes --------------------------------------------------------------------------------- */

#define TS_MAX_CHILDREN 64
static pid_t ts_children[TS_MAX_CHILDREN];

static void child_forget(pid_t pid) {
  for (int i = 0; i < TS_MAX_CHILDREN; i++)
    if (ts_children[i] == pid)
      ts_children[i] = 0;
}

static int open_or_null(const char *path) {
  return path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)
              : open("/dev/null", O_WRONLY | O_CLOEXEC);
}

/* Fork and exec `argv` with stdout/stderr on `out_fd`/`err_fd`. Only async-signal-safe calls in the child. */
static pid_t spawn_fds(char *const argv[], int out_fd, int err_fd) {
  int in_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (in_fd < 0)
    return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* Die with the test process, whatever stops it (a timeout's SIGKILL included). */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
      _exit(127);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
      _exit(127);
    close_range(3, ~0u, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(argv[0], argv);
    _exit(127);
  }
  close(in_fd);
  if (pid > 0) {
    for (int i = 0; i < TS_MAX_CHILDREN; i++) {
      if (ts_children[i] == 0) {
        ts_children[i] = pid;
        break;
      }
    }
  }
  return pid;
}

pid_t ts_spawn(char *const argv[], const char *out_path, const char *err_path) {
  int out_fd = open_or_null(out_path);
  int err_fd = open_or_null(err_path);
  pid_t pid = -1;
  if (out_fd >= 0 && err_fd >= 0)
    pid = spawn_fds(argv, out_fd, err_fd);
  if (out_fd >= 0)
    close(out_fd);
  if (err_fd >= 0)
    close(err_fd);
  return pid;
}

bool ts_wait_exit(pid_t pid, uint64_t timeout_ms, int *status) {
  uint64_t deadline = ts_now_ms() + timeout_ms;
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      child_forget(pid);
      if (status)
        *status = st;
      return true;
    }
    if (r < 0 && errno != EINTR)
      return false;
    if (ts_now_ms() >= deadline)
      return false;
    usleep(10 * 1000);
  }
}

int ts_stop(pid_t pid, int sig, uint64_t grace_ms) {
  if (pid <= 0)
    return -1;
  int st = 0;
  kill(pid, sig);
  if (ts_wait_exit(pid, grace_ms, &st))
    return st;
  kill(pid, SIGKILL);
  if (ts_wait_exit(pid, 5000, &st))
    return st;
  return -1;
}

void ts_kill_all(void) {
  for (int i = 0; i < TS_MAX_CHILDREN; i++) {
    if (ts_children[i] > 0) {
      pid_t pid = ts_children[i];
      kill(pid, SIGKILL);
      ts_wait_exit(pid, 5000, NULL);
      ts_children[i] = 0;
    }
  }
}

static char *fd_contents(int fd, size_t *len) {
  off_t size = lseek(fd, 0, SEEK_END);
  if (size < 0)
    return NULL;
  char *buf = malloc((size_t)size + 1);
  if (!buf)
    return NULL;
  size_t got = 0;
  while (got < (size_t)size) {
    ssize_t n = pread(fd, buf + got, (size_t)size - got, (off_t)got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  buf[got] = '\0';
  if (len)
    *len = got;
  return buf;
}

int ts_run(char *const argv[], uint64_t timeout_ms, char **out, char **err) {
  if (out)
    *out = NULL;
  if (err)
    *err = NULL;
  int out_fd = memfd_create("ts-run-stdout", MFD_CLOEXEC);
  int err_fd = memfd_create("ts-run-stderr", MFD_CLOEXEC);
  int code = -1;
  if (out_fd >= 0 && err_fd >= 0) {
    pid_t pid = spawn_fds(argv, out_fd, err_fd);
    if (pid > 0) {
      int st = 0;
      if (!ts_wait_exit(pid, timeout_ms, &st))
        st = ts_stop(pid, SIGKILL, 0);
      if (st >= 0 && WIFEXITED(st))
        code = WEXITSTATUS(st);
    }
    if (out)
      *out = fd_contents(out_fd, NULL);
    if (err)
      *err = fd_contents(err_fd, NULL);
  }
  if (out_fd >= 0)
    close(out_fd);
  if (err_fd >= 0)
    close(err_fd);
  return code;
}

char *ts_read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  char *buf = fd_contents(fd, len);
  close(fd);
  return buf;
}

bool ts_wait_path(const char *path, uint64_t timeout_ms) {
  uint64_t deadline = ts_now_ms() + timeout_ms;
  while (access(path, F_OK) != 0) {
    if (ts_now_ms() >= deadline)
      return false;
    usleep(10 * 1000);
  }
  return true;
}

/* Reap whatever of the group was reparented to us (we are a subreaper) and report whether it is gone. */
bool ts_group_gone(void *arg) {
  pid_t pgid = *(pid_t *)arg;
  while (waitpid(-pgid, NULL, WNOHANG) > 0) {
  }
  return kill(-pgid, 0) == -1 && errno == ESRCH;
}

/* Live (non-zombie) processes whose process group is `pgid`, from /proc. */
int ts_group_members(pid_t pgid) {
  DIR *d = opendir("/proc");
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e = NULL;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9')
      continue;
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    char buf[512];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *rp = strrchr(buf, ')'); /* the command name may contain anything */
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (rp && sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid && state != 'Z')
      n++;
  }
  closedir(d);
  return n;
}

/* ---- stdio peers ------------------------------------------------------------------------------------ */

const char *ts_agenthost(void) {
  const char *v = getenv("AH_TEST_AGENTHOST");
  cr_assert(v && *v, "AH_TEST_AGENTHOST is not set (run the tests through meson test)");
  return v;
}

void ts_stdio_prepare(ts_stdio *h) {
  memset(h, 0, sizeof *h);
  h->pid = -1;
  h->in = h->out = -1;
  h->dir = ts_mkdtemp();
  cr_assert(h->dir);
  /* The sessions' cwd is not inside the state directory: the file tools refuse the host's own files. */
  h->work = ts_mkdtemp();
  cr_assert(h->work);
  cr_assert(asprintf(&h->log, "%s/host.log", h->dir) > 0);
  free(ts_write_file(h->dir, "empty.ini", ""));
}

void ts_stdio_exec(const ts_stdio *h, int in_fd, int out_fd, const char *mode, const char *env) {
  int err = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || err < 0 || dup2(err, 2) < 0)
    _exit(127);
  for (int fd = 3; fd < 1024; fd++)
    close(fd);
  char *run = NULL, *cfg = NULL;
  if (asprintf(&run, "%s/run", h->dir) < 0 || asprintf(&cfg, "%s/empty.ini", h->dir) < 0)
    _exit(127);
  if (env)
    putenv((char *)env);
  const char *exe = getenv("AH_TEST_AGENTHOST");
  char *argv[] = {(char *)exe, "--state-dir", h->dir, "--runtime-dir", run, "--config",
                  cfg,         (char *)mode,  NULL};
  execv(exe, argv);
  _exit(127);
}

void ts_stdio_spawn(ts_stdio *h, const char *mode, const char *env) {
  int in[2], out[2];
  (void)ts_agenthost();
  cr_assert_eq(pipe2(in, O_CLOEXEC), 0);
  cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ts_stdio_exec(h, in[0], out[1], mode, env);
  }
  close(in[0]);
  close(out[1]);
  h->pid = pid;
  h->in = in[1];
  h->out = out[0];
  h->eof = false;
  h->len = 0;
  signal(SIGPIPE, SIG_IGN);
}

void ts_stdio_start(ts_stdio *h, const char *mode, const char *env) {
  ts_stdio_prepare(h);
  ts_stdio_spawn(h, mode, env);
}

void ts_stdio_close_stdin(ts_stdio *h) {
  if (h->in >= 0)
    close(h->in);
  h->in = -1;
}

void ts_stdio_end(ts_stdio *h) {
  ts_stdio_close_stdin(h);
  if (h->out >= 0)
    close(h->out);
  h->out = -1;
  if (h->pid > 0) {
    kill(h->pid, SIGKILL);
    waitpid(h->pid, NULL, 0);
    h->pid = -1;
  }
}

void ts_stdio_free(ts_stdio *h) {
  ts_stdio_end(h);
  if (h->dir)
    ts_rmtree(h->dir);
  if (h->work)
    ts_rmtree(h->work);
  free(h->dir);
  free(h->work);
  free(h->log);
  free(h->buf);
  memset(h, 0, sizeof *h);
}

void ts_stdio_check_log(const ts_stdio *h) {
  char *log = ts_read_file(h->log, NULL);
  if (!log)
    return;
  bool bad = strstr(log, "AddressSanitizer") || strstr(log, "LeakSanitizer") || strstr(log, "runtime error:");
  char *at = bad ? strstr(log, "Sanitizer") : NULL;
  if (!at && bad)
    at = strstr(log, "runtime error:");
  cr_expect(!bad, "sanitizer report in the host's log: %.2000s", at ? at : "");
  free(log);
}

int ts_stdio_stop_unread(ts_stdio *h, const char *how, uint64_t timeout_ms) {
  if (strcmp(how, "eof") == 0)
    ts_stdio_close_stdin(h);
  else
    kill(h->pid, strcmp(how, "SIGINT") == 0 ? SIGINT : SIGTERM);
  int status = 0;
  if (!ts_wait_exit(h->pid, timeout_ms, &status)) {
    kill(h->pid, SIGKILL);
    ts_wait_exit(h->pid, 5000, NULL);
    status = -1;
  }
  h->pid = -1;
  return status;
}

void ts_stdio_send_raw(ts_stdio *h, const char *bytes, size_t n) {
  while (n) {
    ssize_t w = write(h->in, bytes, n);
    if (w < 0 && errno == EINTR)
      continue;
    cr_assert(w > 0, "write to the host: %s", strerror(errno));
    bytes += w;
    n -= (size_t)w;
  }
}

void ts_stdio_send_line(ts_stdio *h, const char *line) {
  ts_stdio_send_raw(h, line, strlen(line));
  ts_stdio_send_raw(h, "\n", 1);
}

void ts_stdio_send_json(ts_stdio *h, const json_t *msg) {
  char *text = json_dumps(msg, JSON_COMPACT);
  ts_stdio_send_line(h, text);
  free(text);
}

/* The next message, before h->check sees it. */
static json_t *stdio_next(ts_stdio *h, uint64_t timeout_ms) {
  uint64_t end = ts_now_ms() + timeout_ms;
  for (;;) {
    char *nl = h->buf ? memchr(h->buf, '\n', h->len) : NULL;
    if (nl) {
      size_t n = (size_t)(nl - h->buf);
      json_error_t e;
      json_t *msg = json_loadb(h->buf, n, h->json_flags, &e);
      cr_assert(msg, "stdout carried a line that is not JSON: %.*s", (int)(n > 300 ? 300 : n), h->buf);
      memmove(h->buf, nl + 1, h->len - n - 1);
      h->len -= n + 1;
      return msg;
    }
    uint64_t now = ts_now_ms();
    if (now >= end || h->eof)
      return NULL;
    struct pollfd p = {.fd = h->out, .events = POLLIN};
    int r = poll(&p, 1, (int)(end - now));
    if (r <= 0)
      continue;
    if (h->cap - h->len < 65536) {
      h->cap = h->cap ? h->cap * 2 : 131072;
      h->buf = realloc(h->buf, h->cap);
      cr_assert(h->buf);
    }
    ssize_t got = read(h->out, h->buf + h->len, h->cap - h->len);
    if (got <= 0) {
      h->eof = true;
      return NULL;
    }
    h->len += (size_t)got;
  }
}

json_t *ts_stdio_next_msg(ts_stdio *h, uint64_t timeout_ms) {
  json_t *msg = stdio_next(h, timeout_ms);
  if (h->check)
    h->check(h, msg);
  return msg;
}

bool ts_rpc_is_response(const json_t *m) {
  return !json_object_get(m, "method") && (json_object_get(m, "result") || json_object_get(m, "error"));
}

const char *ts_rpc_method(const json_t *m) {
  return json_string_value(json_object_get(m, "method"));
}

int ts_rpc_error_code(const json_t *r) {
  return (int)json_integer_value(json_object_get(json_object_get(r, "error"), "code"));
}

json_t *ts_stdio_next_response(ts_stdio *h, uint64_t timeout_ms,
                               void (*on_other)(ts_stdio *h, json_t *m, void *arg), void *arg) {
  uint64_t end = ts_now_ms() + timeout_ms;
  for (;;) {
    uint64_t now = ts_now_ms();
    json_t *m = ts_stdio_next_msg(h, end > now ? end - now : 0);
    if (!m || ts_rpc_is_response(m))
      return m;
    if (on_other)
      on_other(h, m, arg);
    json_decref(m);
  }
}

json_t *ts_stdio_answer(ts_stdio *h, int id, const char *method) {
  json_t *r = ts_stdio_next_response(h, 10000, NULL, NULL);
  cr_assert(r, "no answer to %s", method);
  cr_assert_eq(json_integer_value(json_object_get(r, "id")), id, "answer to another id");
  return r;
}
