#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

const char *bench_prog = "bench";

uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int bench_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int bench_cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? -1 : x > y;
}

size_t bench_rank(size_t n, unsigned p) {
  size_t i = (n * p + 99) / 100;
  return i ? i - 1 : 0;
}

long bench_status_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  if (pid > 0)
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
  else
    snprintf(path, sizeof path, "/proc/self/status");
  size_t flen = strlen(field);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, flen) == 0)
      kib = strtol(line + flen, NULL, 10);
  if (f)
    fclose(f);
  return kib;
}

bool bench_peak_reset(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/clear_refs", (long)pid);
  FILE *f = pid > 0 ? fopen(path, "w") : NULL;
  if (!f)
    return false;
  bool ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok;
}

const char *bench_verdict(bool met) {
  return met ? "met" : "MISSED";
}

int bench_mkdtemp(char *dir, size_t size, const char *root, const char *name) {
  snprintf(dir, size, "%s/%s-XXXXXX", root, name);
  if (!mkdtemp(dir)) {
    char what[128];
    snprintf(what, sizeof what, "%s: mkdtemp", bench_prog);
    perror(what);
    return -1;
  }
  return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

int bench_rm_tree(const char *dir) {
  return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- a child on pipes ---------------------------------------------------------------------------------- */

volatile pid_t bench_live_pid;
volatile sig_atomic_t bench_stop_signal;

/* Kill the child at once; its stdout then ends, and the normal error path reaps it and cleans up. */
static void on_stop_signal(int sig) {
  bench_stop_signal = sig;
  pid_t p = bench_live_pid;
  if (p > 0)
    kill(p, SIGKILL);
}

void bench_catch_stop_signals(void) {
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {.sa_handler = on_stop_signal}; /* no SA_RESTART: poll() returns EINTR */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

void bench_fail(const bench_proc *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: %s: ", bench_prog, p ? p->label : "setup");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (p && p->log_path[0]) {
    /* the child's last stderr lines explain most failures */
    FILE *f = fopen(p->log_path, "r");
    char line[1024];
    char tail[8][1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
      snprintf(tail[n++ % 8], sizeof tail[0], "%s", line);
    if (f)
      fclose(f);
    for (int i = n > 8 ? n - 8 : 0; i < n; i++)
      fprintf(stderr, "  child stderr: %s", tail[i % 8]);
  }
}

void bench_reap(bench_proc *p, bool kill_it) {
  if (p->to_fd >= 0)
    close(p->to_fd);
  if (p->from_fd >= 0)
    close(p->from_fd);
  p->to_fd = p->from_fd = -1;
  if (p->pid > 0) {
    if (kill_it)
      kill(p->pid, SIGKILL);
    while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR)
      ;
  }
  p->pid = 0;
  bench_live_pid = 0;
}

int bench_spawn(bench_proc *p, char *const argv[]) {
  int in_p[2] = {-1, -1}, out_p[2] = {-1, -1};
  p->to_fd = p->from_fd = -1;
  if (pipe2(in_p, O_CLOEXEC) != 0 || pipe2(out_p, O_CLOEXEC) != 0) {
    bench_fail(p, "pipe: %s", strerror(errno));
    return -1;
  }
  int log_fd = open(p->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  sigset_t dflt;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_p[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out_p[1], 1);
  if (log_fd >= 0)
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
  posix_spawnattr_init(&attr);
  sigemptyset(&dflt);
  sigaddset(&dflt, SIGPIPE); /* ignored here, default in the child */
  posix_spawnattr_setsigdefault(&attr, &dflt);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  int rc = posix_spawn(&p->pid, argv[0], &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(in_p[0]);
  close(out_p[1]);
  if (log_fd >= 0)
    close(log_fd);
  p->to_fd = in_p[1];
  p->from_fd = out_p[0];
  if (rc != 0) {
    p->pid = 0;
    bench_fail(p, "posix_spawn %s: %s", argv[0], strerror(rc));
    bench_reap(p, false);
    return -1;
  }
  bench_live_pid = p->pid;
  if (bench_stop_signal)
    kill(p->pid, SIGKILL);
  return 0;
}

bool bench_stopped(int errors) {
  if (!errors && !bench_stop_signal)
    return false;
  if (bench_stop_signal)
    fprintf(stderr, "%s: interrupted by signal %d\n", bench_prog, (int)bench_stop_signal);
  else
    fprintf(stderr, "%s: stopped on the error above\n", bench_prog);
  return true;
}
