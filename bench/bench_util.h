/* Helpers shared by the benchmark programs (bench/acp.c, sdk.c, remote.c, sessions.c): the monotonic clock,
 * nearest-rank percentiles, /proc status figures, temporary directories, and a child process on pipes
 * (spawn, failure report with its stderr tail, reap, kill on SIGINT/SIGTERM). libc only. */
#ifndef AGENTHOST_BENCH_UTIL_H
#define AGENTHOST_BENCH_UTIL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The program's name, the prefix of its messages ("bench_sdk"); set it first thing in main(). */
extern const char *bench_prog;

uint64_t bench_now_ns(void); /* CLOCK_MONOTONIC */

/* qsort comparators, ascending. */
int bench_cmp_u64(const void *a, const void *b);
int bench_cmp_long(const void *a, const void *b);

/* Nearest rank: the index of the p-th percentile among n sorted samples. */
size_t bench_rank(size_t n, unsigned p);

/* A "Vm...:" figure in KiB from /proc/<pid>/status (pid 0: /proc/self/status), -1 when absent. */
long bench_status_kib(pid_t pid, const char *field);

/* Reset the process's peak RSS (VmHWM) to its current RSS (writes 5 to /proc/PID/clear_refs): a peak read
 * afterwards as bench_status_kib(pid, "VmHWM:") misses nothing, unlike samples, which miss what is
 * allocated and freed between two of them. False when the reset is not allowed here. */
bool bench_peak_reset(pid_t pid);

/* "met" or "MISSED". */
const char *bench_verdict(bool met);

/* mkdtemp() of ROOT/NAME-XXXXXX into dir; on failure perror("<bench_prog>: mkdtemp") and -1. */
int bench_mkdtemp(char *dir, size_t size, const char *root, const char *name);

/* Remove the tree at dir (nftw, depth first); nftw's result. */
int bench_rm_tree(const char *dir);

/* ---- a child on pipes ---------------------------------------------------------------------------------- */

typedef struct bench_proc {
  const char *label;
  pid_t pid;
  int to_fd;   /* the child's stdin */
  int from_fd; /* the child's stdout */
  char log_path[600];
} bench_proc;

extern volatile pid_t bench_live_pid;           /* the child running now, killed by the signal handler */
extern volatile sig_atomic_t bench_stop_signal; /* SIGINT or SIGTERM received: the run ends as an error */

/* SIGPIPE ignored; SIGINT and SIGTERM kill the live child at once (no SA_RESTART: poll() returns EINTR). */
void bench_catch_stop_signals(void);

/* "<bench_prog>: <label>: <message>", then the last 8 lines of the child's stderr (p may be NULL). */
void bench_fail(const bench_proc *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* posix_spawn argv with stdin and stdout on pipes (p->to_fd, p->from_fd) and stderr to p->log_path;
 * SIGPIPE default in the child. 0, or -1 (reported, nothing left open). */
int bench_spawn(bench_proc *p, char *const argv[]);

/* Close both pipes, SIGKILL the child when kill_it, and reap it (when p->pid > 0). */
void bench_reap(bench_proc *p, bool kill_it);

/* After a run: the "interrupted by signal" or "stopped on the error above" line and true when the run
 * must exit 1; false when all went well. */
bool bench_stopped(int errors);

#endif
