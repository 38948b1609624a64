/* Benchmark: a stdio surface (`agenthost sdk` or `agenthost acp`) under a pipelined flood whose answers
 * are not read (reliability finding 2: backpressure on the stdio surfaces).
 *
 * One process, initialized (answer read); its VmRSS then is the baseline of this run. Then REQUESTS
 * (default 200,000) requests of an unknown method (`bench/noop`, answered -32601 without touching
 * sessions) are written as fast as the pipe takes them while stdout is NOT read, for FLOOD_S seconds, then
 * held for HOLD_S more; VmRSS is sampled every 50 ms. Without backpressure the host keeps reading and
 * queues every answer in memory; with it, reading pauses and the client's writes block. Then the client
 * reads: every request must be answered (nothing lost), `shutdown` answered and the exit status 0.
 *
 * Usage: bench_flood AGENTHOST MODE [REQUESTS]. Prints figures; exits non-zero only on errors (a lost
 * answer, a failed child), never on a missed target (peak RSS during the flood ≤ 2× the baseline + 8 MB).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

#define FLOOD_S 4
#define HOLD_S 2
#define DRAIN_S 120

static long peak_kib;

static void sample(pid_t pid) {
  long kib = bench_status_kib(pid, "VmRSS:");
  if (kib > peak_kib)
    peak_kib = kib;
}

/* Read until `want` newline-terminated lines arrived (or the deadline); returns the lines read. */
static size_t read_lines(int fd, size_t want, uint64_t deadline_ns, char *last, size_t last_cap) {
  static char buf[1 << 16];
  size_t lines = 0, tail = 0;
  while (lines < want && bench_now_ns() < deadline_ns) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0)
      continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0)
      break;
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == '\n') {
        lines++;
        if (last)
          last[tail < last_cap ? tail : last_cap - 1] = '\0';
        tail = 0;
      } else if (last && tail + 1 < last_cap) {
        last[tail++] = buf[i];
      }
    }
  }
  return lines;
}

static int write_all(int fd, const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 100);
      continue;
    }
    if (w <= 0)
      return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The requests being written: the current line and how much of it went out. */
typedef struct flood {
  int fd;
  char line[128];
  size_t sent, off, len;
} flood;

/* One non-blocking write of the next request (or of the rest of the current one): 1 when bytes went out,
 * 0 when the pipe is full, -1 on an error (errno). */
static int flood_step(flood *f) {
  if (f->off == f->len) {
    f->len = (size_t)snprintf(f->line, sizeof f->line,
                              "{\"jsonrpc\":\"2.0\",\"id\":%zu,\"method\":\"bench/noop\"}\n", f->sent + 1);
    f->off = 0;
  }
  ssize_t w = write(f->fd, f->line + f->off, f->len - f->off);
  if (w > 0) {
    f->off += (size_t)w;
    if (f->off == f->len)
      f->sent++;
    return 1;
  }
  return w < 0 && errno != EAGAIN && errno != EINTR ? -1 : 0;
}

int main(int argc, char **argv) {
  bench_prog = "bench_flood";
  if (argc < 3) {
    fprintf(stderr, "usage: %s AGENTHOST MODE [REQUESTS]\n", argv[0]);
    return 2;
  }
  const char *mode = argv[2];
  size_t requests = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : 200000;
  bench_catch_stop_signals();
  char dir[256], run[300], cfg[300];
  if (bench_mkdtemp(dir, sizeof dir, getenv("TMPDIR") ?: "/tmp", "bench-flood") != 0)
    return 1;
  snprintf(run, sizeof run, "%s/run", dir);
  snprintf(cfg, sizeof cfg, "%s/empty.ini", dir);
  FILE *f = fopen(cfg, "w");
  if (f)
    fclose(f);
  bench_proc p = {.label = mode};
  snprintf(p.log_path, sizeof p.log_path, "%s/host.log", dir);
  char *args[] = {argv[1], "--state-dir", dir, "--runtime-dir", run, "--config", cfg, (char *)mode, NULL};
  if (bench_spawn(&p, args) != 0)
    return 1;
  int errors = 0;
  char init[700];
  if (strcmp(mode, "acp") == 0)
    snprintf(init, sizeof init,
             "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n");
  else
    snprintf(init, sizeof init,
             "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"cwd\":\"%s\","
             "\"clientInfo\":{\"name\":\"bench_flood\"}}}\n",
             dir);
  char last[512] = "";
  if (write_all(p.to_fd, init) != 0 ||
      read_lines(p.from_fd, 1, bench_now_ns() + 10000000000ull, last, sizeof last) != 1) {
    bench_fail(&p, "initialize was not answered");
    errors++;
  }
  usleep(200 * 1000);
  long base_kib = bench_status_kib(p.pid, "VmRSS:");
  peak_kib = base_kib;
  bool exact = bench_peak_reset(p.pid);

  /* The flood, stdout unread. */
  fcntl(p.to_fd, F_SETFL, fcntl(p.to_fd, F_GETFL) | O_NONBLOCK);
  flood fl = {.fd = p.to_fd};
  uint64_t t0 = bench_now_ns(), flood_end = t0 + FLOOD_S * 1000000000ull;
  uint64_t hold_end = flood_end + HOLD_S * 1000000000ull, next_sample = 0;
  while (!errors && bench_now_ns() < hold_end) {
    uint64_t now = bench_now_ns();
    if (now >= next_sample) {
      sample(p.pid);
      next_sample = now + 50000000ull;
    }
    if (now >= flood_end || fl.sent == requests) {
      usleep(20 * 1000);
      continue;
    }
    int w = flood_step(&fl);
    if (w < 0) {
      bench_fail(&p, "write: %s", strerror(errno));
      errors++;
    } else if (w == 0) {
      struct pollfd q = {.fd = p.to_fd, .events = POLLOUT};
      poll(&q, 1, 20);
    }
  }
  size_t sent_unread = fl.sent;
  if (exact && bench_status_kib(p.pid, "VmHWM:") > peak_kib) /* the kernel's high-water mark misses nothing */
    peak_kib = bench_status_kib(p.pid, "VmHWM:");
  long peak_unread = peak_kib;

  /* The client reads again: the rest is written, every answer must arrive. */
  uint64_t drain_end = bench_now_ns() + DRAIN_S * 1000000000ull;
  size_t answered = 0;
  while (!errors && answered < requests && bench_now_ns() < drain_end) {
    if (fl.sent < requests)
      (void)flood_step(&fl);
    answered += read_lines(p.from_fd, fl.sent < requests ? 1 : requests - answered,
                           bench_now_ns() + 5000000ull, NULL, 0);
    sample(p.pid);
  }
  if (!errors && answered != requests) {
    bench_fail(&p, "%zu of %zu requests answered", answered, requests);
    errors++;
  }
  fcntl(p.to_fd, F_SETFL, fcntl(p.to_fd, F_GETFL) & ~O_NONBLOCK);
  if (!errors && (write_all(p.to_fd, "{\"jsonrpc\":\"2.0\",\"id\":-1,\"method\":\"shutdown\"}\n") != 0 ||
                  read_lines(p.from_fd, 1, bench_now_ns() + 10000000000ull, last, sizeof last) != 1)) {
    if (strcmp(mode, "sdk") == 0) {
      bench_fail(&p, "shutdown was not answered");
      errors++;
    }
  }
  close(p.to_fd);
  p.to_fd = -1;
  int status = 0;
  uint64_t exit_end = bench_now_ns() + 20000000000ull;
  pid_t r = 0;
  while ((r = waitpid(p.pid, &status, WNOHANG)) == 0 && bench_now_ns() < exit_end)
    usleep(10000);
  if (r != p.pid) {
    bench_fail(&p, "did not exit");
    errors++;
    bench_reap(&p, true);
  } else {
    p.pid = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      bench_fail(&p, "exit status %d", status);
      errors++;
    }
    bench_reap(&p, false);
  }
  bench_rm_tree(dir);
  if (bench_stopped(errors))
    return 1;
  double base = (double)base_kib / 1024, peak = (double)peak_unread / 1024;
  printf("Stdio flood, stdout unread: `agenthost %s`, %zu pipelined bench/noop requests\n", mode, requests);
  printf("   baseline RSS after initialize     %8.1f MB\n", base);
  printf("   peak RSS, %d s flood + %d s hold   %8.1f MB  (%.2fx the baseline)\n", FLOOD_S, HOLD_S, peak,
         peak / base);
  printf("   requests the host took unread     %8zu of %zu (the client's writes blocked: %s)\n", sent_unread,
         requests, sent_unread < requests ? "yes" : "no");
  printf("   answered once the client read     %8zu of %zu\n", answered, requests);
  printf("   peak RSS over the whole run       %8.1f MB\n", (double)peak_kib / 1024);
  printf("   target: peak during the flood <= 2x baseline + 8 MB: %s\n", bench_verdict(peak <= 2 * base + 8));
  return 0;
}
