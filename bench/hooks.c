/* bench_hooks AGENTHOST [N] — the cost of one command hook on a tool call, against none, in the same run.
 *
 *   none  `agenthost sdk` without hooks: N prompts `/tool read_file {"path": "f.txt"}` (echo provider;
 *         read_file runs without asking)
 *   hook  `agenthost sdk` with [hook.noop] event = before_tool, command = /bin/true: the same prompts, each
 *         tool call waiting for one child process (spawned through the host's process service, its document
 *         written on stdin, its exit observed and its pipes closed) before it runs
 * Two times per prompt: to the tool's stored result and to turn/ended. The two hosts are driven call by call,
 * interleaved, so that the machine's noise falls on both. Figures: p50 and p95 of each; the overhead of the
 * hook is the difference of the p50s (the cost of one spawn). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_lines.h"
#include "bench_util.h"

#define WARMUP 10
#define PROMPT "/tool read_file {\\\"path\\\": \\\"f.txt\\\"}"

static double ms(uint64_t ns) {
  return (double)ns / 1e6;
}

static int start_host(bench_chan *c, const char *agenthost, const char *dir, const char *name,
                      const char *ini, const char *work) {
  static char paths[2][3][700];
  int k = strcmp(name, "none") == 0 ? 0 : 1;
  char *conf = paths[k][0], *state = paths[k][1];
  snprintf(conf, 700, "%s/%s.ini", dir, name);
  snprintf(state, 700, "%s/state-%s", dir, name);
  snprintf(c->proc.log_path, sizeof c->proc.log_path, "%s/%s.log", dir, name);
  FILE *f = fopen(conf, "w");
  if (!f) {
    perror("bench_hooks: config");
    return -1;
  }
  fputs(ini, f);
  fclose(f);
  char *argv[] = {(char *)agenthost, "--config", conf,  "--state-dir", state,
                  "--runtime-dir",   state,      "sdk", NULL};
  if (bench_spawn(&c->proc, argv) != 0)
    return -1;
  if (bench_chan_send(c,
                      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"cwd\":\"%s\","
                      "\"capabilities\":{\"requests\":true}}}",
                      work) != 0)
    return -1;
  json_t *m = bench_chan_answer(c, 1, NULL, NULL);
  if (!m)
    return -1;
  json_decref(m);
  return 0;
}

int main(int argc, char **argv) {
  bench_prog = "bench_hooks";
  if (argc < 2) {
    fprintf(stderr, "usage: bench_hooks AGENTHOST [N]\n");
    return 2;
  }
  int n = argc > 2 ? atoi(argv[2]) : 200;
  bench_catch_stop_signals();
  char dir[512];
  if (bench_mkdtemp(dir, sizeof dir, getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", "bench-hooks") != 0)
    return 1;
  char work[700], file[760];
  snprintf(work, sizeof work, "%s/work", dir);
  mkdir(work, 0700);
  snprintf(file, sizeof file, "%s/f.txt", work);
  FILE *f = fopen(file, "w");
  if (f) {
    fputs("a small file\n", f);
    fclose(f);
  }
  bench_chan none = {.proc = {.label = "agenthost sdk (no hook)"}};
  bench_chan hook = {.proc = {.label = "agenthost sdk (one hook)"}};
  int errors = 0;
  uint64_t *nr = calloc((size_t)n, sizeof *nr), *ne = calloc((size_t)n, sizeof *ne),
           *hr = calloc((size_t)n, sizeof *hr), *he = calloc((size_t)n, sizeof *he);
  if (!nr || !ne || !hr || !he || start_host(&none, argv[1], dir, "none", "", work) != 0 ||
      start_host(&hook, argv[1], dir, "hook", "[hook.noop]\nevent = before_tool\ncommand = /bin/true\n",
                 work) != 0) {
    errors++;
    goto out;
  }
  int64_t id = 2;
  for (int i = -WARMUP; i < n && !bench_stop_signal; i++, id++) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    if (bench_chan_tool_prompt(&none, id, PROMPT, &a, &b) != 0 ||
        bench_chan_tool_prompt(&hook, id, PROMPT, &c, &d) != 0) {
      errors++;
      break;
    }
    if (i >= 0) {
      nr[i] = a;
      ne[i] = b;
      hr[i] = c;
      he[i] = d;
    }
  }
  if (!errors && !bench_stop_signal) {
    uint64_t *all[] = {nr, ne, hr, he};
    for (size_t k = 0; k < 4; k++)
      qsort(all[k], (size_t)n, sizeof *nr, bench_cmp_u64);
    size_t p50 = bench_rank((size_t)n, 50), p95 = bench_rank((size_t)n, 95);
    printf("a read_file tool call through `agenthost sdk`, %d prompts each after %d warm-up, interleaved\n",
           n, WARMUP);
    printf("  no hook:     result p50 %.3f ms  p95 %.3f ms   turn end p50 %.3f ms\n", ms(nr[p50]),
           ms(nr[p95]), ms(ne[p50]));
    printf("  one hook:    result p50 %.3f ms  p95 %.3f ms   turn end p50 %.3f ms  (%.2fx)\n", ms(hr[p50]),
           ms(hr[p95]), ms(he[p50]), (double)hr[p50] / (double)nr[p50]);
    printf("  overhead of one no-op command hook (p50, prompt to the stored result): %.3f ms\n",
           ms(hr[p50]) - ms(nr[p50]));
  }
out:
  bench_chan_reap(&none);
  bench_chan_reap(&hook);
  free(nr);
  free(ne);
  free(hr);
  free(he);
  bench_rm_tree(dir);
  return bench_stopped(errors) ? 1 : 0;
}
