/* `agenthost analyze` over large recordings: MB/s and peak RSS for 256 MiB and 1 GiB of observation JSONL,
 * against the floor of reading the same file (a pass over its bytes looking for newlines) in the same
 * invocation. The recordings are what a browser tab records during streaming turns: per turn its
 * turn/started, 20 session.delta pushes, a message/committed, a model/usage and a turn/ended, in
 * session.event frames. The report's usage is checked against what was written, so the figure is of a
 * correct analysis. Target (docs/usage.md): ≥ 100 MB/s in bounded memory.
 *
 * usage: bench_analyze AGENTHOST [MIB...]   (default 256 1024) */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

static const char sid[] = "01a2380d-f12c-7003-9d38-ad74372d27fa";
static const char text[] =
    "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. ut enim ad minim veniam, quis nostrud exercitation "
    "ullamco laboris nisi ut aliquip ex ea commodo consequat.";

/* Write `mib` MiB of recording; returns the turns written (each 1000 input and 100 output tokens). */
static long write_recording(const char *path, long mib) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  setvbuf(f, NULL, _IOFBF, 1 << 20);
  long seq = 0, es = 0, cur = 0, turns = 0;
  long long bytes = 0, want = (long long)mib << 20;
  while (bytes < want) {
    char turn[32];
    snprintf(turn, sizeof turn, "t%08ld", turns++);
#define HEAD                                                                                         \
  "{\"v\":1,\"side\":\"client\",\"source\":\"ui\",\"conn\":\"c1\",\"seq\":%ld,\"dir\":\"received\"," \
  "\"wall\":\"2026-12-01T10:00:00.000Z\",\"mono\":%ld,\"payload\":"
#define EVENT(kind, data)                                                                                  \
  bytes +=                                                                                                 \
      fprintf(f,                                                                                           \
              HEAD "{\"kind\":\"server-request\",\"rpcId\":\"p%ld\",\"method\":\"session.event\","         \
                   "\"replyRequired\":false,\"cursor\":%ld,\"seq\":%ld,\"payload\":{\"sessionId\":\"%s\"," \
                   "\"event\":{\"cursor\":%ld,\"sessionId\":\"%s\",\"seq\":%ld,\"kind\":\"" kind "\","     \
                   "\"time\":\"2026-12-01T10:00:00.000Z\",\"turnId\":\"%s\",\"data\":" data "}}}}\n",      \
              seq, seq, seq, cur, es, sid, cur, sid, es, turn)
    seq++, es++, cur++;
    EVENT("turn/started", "{\"provider\":\"p\",\"model\":\"m\"}");
    for (int d = 0; d < 20; d++) {
      seq++;
      bytes +=
          fprintf(f,
                  HEAD "{\"kind\":\"server-request\",\"rpcId\":\"p%ld\",\"method\":\"session.delta\","
                       "\"replyRequired\":false,\"cursor\":%ld,\"payload\":{\"sessionId\":\"%s\",\"turnId\":"
                       "\"%s\",\"messageId\":\"m\",\"text\":\"%s\"}}}\n",
                  seq, seq, seq, cur, sid, turn, text);
    }
    seq++, es++, cur++;
    bytes += fprintf(
        f,
        HEAD "{\"kind\":\"server-request\",\"rpcId\":\"p%ld\",\"method\":\"session.event\","
             "\"replyRequired\":false,\"cursor\":%ld,\"seq\":%ld,\"payload\":{\"sessionId\":\"%s\","
             "\"event\":{\"cursor\":%ld,\"sessionId\":\"%s\",\"seq\":%ld,\"kind\":\"message/committed\","
             "\"time\":\"2026-12-01T10:00:00.000Z\",\"turnId\":\"%s\",\"data\":{\"role\":\"assistant\","
             "\"text\":\"%s%s%s%s\"}}}}}\n",
        seq, seq, seq, cur, es, sid, cur, sid, es, turn, text, text, text, text);
    seq++, es++, cur++;
    EVENT("model/usage", "{\"round\":1,\"usage\":{\"inputTokens\":1000,\"outputTokens\":100,\"requests\":1,"
                         "\"model\":\"m\"}}");
    seq++, es++, cur++;
    EVENT("turn/ended",
          "{\"reason\":\"end\",\"usage\":{\"inputTokens\":1000,\"outputTokens\":100,\"requests\":1,"
          "\"model\":\"m\"}}");
  }
  if (fclose(f) != 0) {
    perror(path);
    exit(1);
  }
  return turns;
}

/* The floor: one pass over the file's bytes counting newlines. */
static double read_floor(const char *path, long long *size) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    perror(path);
    exit(1);
  }
  static char buf[1 << 20];
  long long n = 0, lines = 0;
  uint64_t t0 = bench_now_ns();
  for (;;) {
    ssize_t got = read(fd, buf, sizeof buf);
    if (got <= 0)
      break;
    n += got;
    for (char *p = buf; (p = memchr(p, '\n', (size_t)(buf + got - p))); p++)
      lines++;
  }
  uint64_t t1 = bench_now_ns();
  close(fd);
  *size = n;
  (void)lines;
  return (double)(t1 - t0) / 1e9;
}

/* Run `agenthost analyze --json FILE` with its stdout to `out`; wall seconds and peak RSS (KiB). */
static double run_analyze(const char *bin, const char *path, const char *out, long *rss_kib) {
  uint64_t t0 = bench_now_ns();
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0)
      _exit(127);
    execl(bin, bin, "analyze", "--json", path, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  struct rusage ru;
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: agenthost analyze failed (status %d)\n", bench_prog, status);
    exit(1);
  }
  *rss_kib = ru.ru_maxrss;
  return (double)(bench_now_ns() - t0) / 1e9;
}

int main(int argc, char **argv) {
  bench_prog = "bench_analyze";
  if (argc < 2) {
    fprintf(stderr, "usage: bench_analyze AGENTHOST [MIB...]\n");
    return 2;
  }
  long sizes[8] = {256, 1024};
  int nsizes = 2;
  if (argc > 2) {
    nsizes = 0;
    for (int i = 2; i < argc && nsizes < 8; i++)
      sizes[nsizes++] = atol(argv[i]);
  }
  char dir[600];
  if (bench_mkdtemp(dir, sizeof dir, getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", "bench-analyze") != 0)
    return 1;
  int rc = 0;
  printf("agenthost analyze over browser-tab recordings (streaming turns), target >= 100 MB/s\n");
  printf("%8s %9s %10s %10s %11s %9s %12s %s\n", "MiB", "turns", "floor MB/s", "MB/s", "vs floor", "peak RSS",
         "RSS/turn", "target");
  for (int i = 0; i < nsizes; i++) {
    char path[700], out[700];
    snprintf(path, sizeof path, "%s/rec-%ld.jsonl", dir, sizes[i]);
    snprintf(out, sizeof out, "%s/report-%ld.json", dir, sizes[i]);
    long turns = write_recording(path, sizes[i]);
    long long size = 0;
    double floor_s = read_floor(path, &size);
    long rss = 0;
    double s = run_analyze(argv[1], path, out, &rss);
    double mbps = (double)size / 1e6 / s, floor_mbps = (double)size / 1e6 / floor_s;
    /* the report must be right for the figure to count */
    json_t *rep = json_load_file(out, 0, NULL);
    json_t *u = json_object_get(json_array_get(json_object_get(rep, "sessions"), 0), "usage");
    long long in = json_integer_value(json_object_get(u, "inputTokens"));
    bool complete = json_is_true(json_object_get(json_object_get(rep, "coverage"), "complete"));
    json_decref(rep);
    if (in != (long long)turns * 1000 || !complete) {
      fprintf(stderr, "%s: wrong report for %ld MiB: inputTokens %lld (want %lld), coverage %s\n", bench_prog,
              sizes[i], in, (long long)turns * 1000, complete ? "complete" : "incomplete");
      rc = 1;
    }
    printf("%8ld %9ld %10.0f %10.1f %10.2fx %7ld MB %9.0f B %s\n", sizes[i], turns, floor_mbps, mbps,
           mbps / floor_mbps, rss / 1024, (double)rss * 1024 / (double)turns, bench_verdict(mbps >= 100));
    fflush(stdout);
    unlink(path);
    unlink(out);
  }
  bench_rm_tree(dir);
  return rc;
}
