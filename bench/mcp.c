/* bench_mcp AGENTHOST NODE EVERYTHING_BIN [N] — a `tools/call` through agenthost against the same MCP server
 * driven directly over stdio, in the same run.
 *
 *   direct   the official server-everything on stdio, spoken to by this program: initialize, initialized,
 *            then N `tools/call` echo, one at a time; the time from writing the request to reading its
 * answer. agenthost `agenthost sdk` with [mcp.ev] = the same server: N prompts `/tool mcp__ev__echo {…}`
 * (echo provider; the policy set to allow by the first call's allow_always). Two times per prompt: to the
 *            tool's result event (prompt receipt, turn start, the tool source's list, the call through the
 * mcp plugin, the result stored and published) and to turn/ended. The two are interleaved call by call so
 * that the machine's noise falls on both. Figures: p50 and p95 of each; the overhead is the difference of the
 * p50s. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_lines.h"
#include "bench_util.h"

#define WAIT_NS BENCH_CHAN_WAIT_NS
#define WARMUP 10

static int answer_of(bench_chan *c, int64_t id) {
  json_t *m = bench_chan_answer(c, id, NULL, NULL);
  if (!m)
    return -1;
  json_decref(m);
  return 0;
}

static double ms(uint64_t ns) {
  return (double)ns / 1e6;
}

int main(int argc, char **argv) {
  bench_prog = "bench_mcp";
  if (argc < 4) {
    fprintf(stderr, "usage: bench_mcp AGENTHOST NODE EVERYTHING_BIN [N]\n");
    return 2;
  }
  if (!argv[2][0] || access(argv[3], R_OK) != 0) {
    printf("bench_mcp: skipped: no node or no server-everything (npm ci in tests/integration)\n");
    return 0;
  }
  int n = argc > 4 ? atoi(argv[4]) : 200;
  bench_catch_stop_signals();
  char dir[512];
  if (bench_mkdtemp(dir, sizeof dir, getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", "bench-mcp") != 0)
    return 1;
  char conf[700], state[700], work[700];
  snprintf(conf, sizeof conf, "%s/agenthost.ini", dir);
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(work, sizeof work, "%s/work", dir);
  mkdir(work, 0700);
  FILE *f = fopen(conf, "w");
  if (!f) {
    perror("bench_mcp: config");
    return 1;
  }
  fprintf(f, "[mcp.ev]\ncommand = %s\nargs = %s stdio\n", argv[2], argv[3]);
  fclose(f);

  bench_chan direct = {.proc = {.label = "server-everything"}};
  bench_chan host = {.proc = {.label = "agenthost sdk"}};
  snprintf(direct.proc.log_path, sizeof direct.proc.log_path, "%s/direct.log", dir);
  snprintf(host.proc.log_path, sizeof host.proc.log_path, "%s/host.log", dir);
  char *dargv[] = {argv[2], argv[3], "stdio", NULL};
  char *hargv[] = {argv[1], "--config", conf, "--state-dir", state, "--runtime-dir", state, "sdk", NULL};
  int errors = 0;
  uint64_t *d_ns = calloc((size_t)n, sizeof *d_ns), *r_ns = calloc((size_t)n, sizeof *r_ns),
           *e_ns = calloc((size_t)n, sizeof *e_ns);
  if (!d_ns || !r_ns || !e_ns || bench_spawn(&direct.proc, dargv) != 0 ||
      bench_spawn(&host.proc, hargv) != 0) {
    errors++;
    goto out;
  }
  int64_t did = 1, hid = 1;
  if (bench_chan_send(
          &direct,
          "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
          "\"2025-11-25\",\"capabilities\":{},\"clientInfo\":{\"name\":\"bench\",\"version\":\"1\"}}}",
          (long long)did) != 0 ||
      answer_of(&direct, did++) != 0 ||
      bench_chan_send(&direct, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}") != 0 ||
      bench_chan_send(&host,
                      "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"initialize\",\"params\":{\"cwd\":\"%s\","
                      "\"capabilities\":{\"requests\":true}}}",
                      (long long)hid, work) != 0 ||
      answer_of(&host, hid++) != 0) {
    errors++;
    goto out;
  }
  for (int i = -WARMUP; i < n && !bench_stop_signal; i++) {
    uint64_t t0 = bench_now_ns();
    if (bench_chan_send(
            &direct,
            "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\","
            "\"arguments\":{\"message\":\"m%d\"}}}",
            (long long)did, i) != 0 ||
        answer_of(&direct, did++) != 0) {
      errors++;
      break;
    }
    uint64_t dt = bench_now_ns() - t0, rt = 0, et = 0;
    char text[96];
    snprintf(text, sizeof text, "/tool mcp__ev__echo {\\\"message\\\": \\\"m%d\\\"}", i);
    if (bench_chan_tool_prompt(&host, hid++, text, &rt, &et) != 0) {
      errors++;
      break;
    }
    if (i >= 0) {
      d_ns[i] = dt;
      r_ns[i] = rt;
      e_ns[i] = et;
    }
  }
  if (!errors && !bench_stop_signal) {
    qsort(d_ns, (size_t)n, sizeof *d_ns, bench_cmp_u64);
    qsort(r_ns, (size_t)n, sizeof *r_ns, bench_cmp_u64);
    qsort(e_ns, (size_t)n, sizeof *e_ns, bench_cmp_u64);
    size_t p50 = bench_rank((size_t)n, 50), p95 = bench_rank((size_t)n, 95);
    printf("tools/call echo of server-everything (stdio), %d calls each after %d warm-up, interleaved\n", n,
           WARMUP);
    printf("  direct over stdio            p50 %.3f ms  p95 %.3f ms\n", ms(d_ns[p50]), ms(d_ns[p95]));
    printf("  through agenthost: result    p50 %.3f ms  p95 %.3f ms  (%.2fx direct)\n", ms(r_ns[p50]),
           ms(r_ns[p95]), (double)r_ns[p50] / (double)d_ns[p50]);
    printf("  through agenthost: turn end  p50 %.3f ms  p95 %.3f ms\n", ms(e_ns[p50]), ms(e_ns[p95]));
    printf("  overhead of agenthost (p50, prompt to the tool's stored result): %.3f ms\n",
           ms(r_ns[p50]) - ms(d_ns[p50]));
  }
out:
  bench_chan_reap(&direct);
  bench_chan_reap(&host);
  free(d_ns);
  free(r_ns);
  free(e_ns);
  bench_rm_tree(dir);
  return bench_stopped(errors) ? 1 : 0;
}
