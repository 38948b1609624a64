/* Benchmark: the ACP surface (`agenthost acp`) against a Node ACP agent on the official SDK
 * (tests/integration/acp/child-agent.mjs, the agent the acp provider's tests run as a child), measured in the
 * same invocation (issue 5, acceptance "bench/").
 *
 * 1. Spawn → `initialize` answered: RUNS (default 20) fresh processes of each kind, interleaved. The clock
 *    starts before posix_spawn() and stops when the answer to `initialize` (written right after the spawn)
 * has been read and parsed. Then each process gets `session/new` and one prompt ("echo hi"), its VmHWM is
 * read from /proc, its stdin is closed, and wait4() gives ru_maxrss (the peak RSS over its whole life, exit
 *    included), which is the figure compared with the target. Targets: agenthost ≥ 10× faster (median),
 *    peak RSS ≤ 8 MB.
 * 2. Prompt → first `agent_message_chunk`: one process of each kind, initialized, one session, WARMUP
 *    prompts, then PROMPTS (default 200) prompts one at a time, each timed from the write() of its
 *    `session/prompt` to the parse of the first agent_message_chunk of that session (and to its stopReason).
 *    agenthost runs its embedded echo provider (the default with an empty config), twice: sending each
 *    committed message whole (the default) and streaming deltas (`[plugin.acp] stream_deltas = true`, where
 *    the first chunk is the first delta). Target (issue 17): the first chunk at or below the Node agent's
 *    time (median), the prompt still stored before the turn's answer.
 *
 * agenthost runs as `agenthost --state-dir D --runtime-dir D/run --config EMPTY acp` with one state
 * directory reused by every run; the Node agent as `node child-agent.mjs`. When node or the SDK (the
 * integration tests' node_modules) is missing, the Node side is skipped and said so.
 *
 * Usage: bench_acp AGENTHOST NODE CHILD_AGENT_MJS [RUNS [PROMPTS]] (NODE may be ""). Prints figures; exits
 * non-zero only on errors (a bad or missing answer, a child that exits non-zero), never on a missed target.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_lines.h"
#include "bench_util.h"

#define WAIT_NS (20ull * 1000000000ull) /* any single wait for a child */
#define WARMUP 20

typedef bench_chan child;
#define child_reap bench_chan_reap
#define send_line bench_chan_send
#define next_msg bench_chan_next

#define await_answer bench_chan_answer

static char top_dir[256];

static int initialize(child *c) {
  if (send_line(c,
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1,"
                "\"clientCapabilities\":{\"fs\":{\"readTextFile\":false,\"writeTextFile\":false},"
                "\"terminal\":false},\"clientInfo\":{\"name\":\"bench_acp\",\"version\":\"1\"}}}") != 0)
    return -1;
  json_t *a = await_answer(c, 1, NULL, NULL);
  if (!a)
    return -1;
  json_int_t v = json_integer_value(json_object_get(json_object_get(a, "result"), "protocolVersion"));
  json_decref(a);
  if (v != 1) {
    bench_fail(&c->proc, "initialize answered protocolVersion %lld", (long long)v);
    return -1;
  }
  return 0;
}

/* session/new: the session id (malloc'ed) or NULL. */
static char *session_new(child *c) {
  if (send_line(c,
                "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/"
                "new\",\"params\":{\"cwd\":\"%s\",\"mcpServers\":[]}}",
                top_dir) != 0)
    return NULL;
  json_t *a = await_answer(c, 2, NULL, NULL);
  const char *sid = a ? json_string_value(json_object_get(json_object_get(a, "result"), "sessionId")) : NULL;
  char *out = sid ? strdup(sid) : NULL;
  if (a && !out)
    bench_fail(&c->proc, "session/new answered without a sessionId");
  json_decref(a);
  return out;
}

typedef struct chunk_wait {
  const char *session;
  uint64_t first; /* time of the first agent_message_chunk, 0 until then */
} chunk_wait;

static void on_chunk(const json_t *msg, void *arg) {
  chunk_wait *w = arg;
  const json_t *p = json_object_get(msg, "params");
  const char *kind = json_string_value(json_object_get(json_object_get(p, "update"), "sessionUpdate"));
  const char *sid = json_string_value(json_object_get(p, "sessionId"));
  if (!w->first && kind && sid && strcmp(kind, "agent_message_chunk") == 0 && strcmp(sid, w->session) == 0)
    w->first = bench_now_ns();
}

/* One prompt: *first_ns and *done_ns from the write. */
static int prompt(child *c, const char *sid, int64_t id, uint64_t *first_ns, uint64_t *done_ns) {
  chunk_wait w = {.session = sid, .first = 0};
  uint64_t t0 = bench_now_ns();
  if (send_line(
          c,
          "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"%s\","
          "\"prompt\":[{\"type\":\"text\",\"text\":\"echo hi\"}]}}",
          (long long)id, sid) != 0)
    return -1;
  json_t *a = await_answer(c, id, on_chunk, &w);
  if (!a)
    return -1;
  uint64_t t1 = bench_now_ns();
  const char *stop = json_string_value(json_object_get(json_object_get(a, "result"), "stopReason"));
  bool ok = stop && strcmp(stop, "end_turn") == 0;
  json_decref(a);
  if (!ok || !w.first) {
    bench_fail(&c->proc, "prompt %lld: %s", (long long)id,
               ok ? "no agent_message_chunk before the answer" : "not end_turn");
    return -1;
  }
  *first_ns = w.first - t0;
  *done_ns = t1 - t0;
  return 0;
}

/* agenthost sdk, asking for the streamed text (capabilities.deltas). */
static int sdk_initialize(child *c) {
  if (send_line(c,
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"cwd\":\"%s\","
                "\"protocolVersion\":1,\"capabilities\":{\"deltas\":true}}}",
                top_dir) != 0)
    return -1;
  json_t *a = await_answer(c, 1, NULL, NULL);
  bool ok = a && json_is_true(json_object_get(json_object_get(json_object_get(a, "result"), "capabilities"),
                                              "deltas"));
  json_decref(a);
  if (!ok)
    bench_fail(&c->proc, "initialize did not grant deltas");
  return ok ? 0 : -1;
}

/* One SDK prompt (the connection's default session): *first_ns to its first session.delta, *done_ns to
 * its turn/ended event, both from the write; the receipt must come too. */
static int sdk_prompt(child *c, int64_t id, uint64_t *first_ns, uint64_t *done_ns) {
  uint64_t t0 = bench_now_ns(), first = 0, done = 0;
  if (send_line(c,
                "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"session/prompt\",\"params\":{\"text\":"
                "\"echo hi\"}}",
                (long long)id) != 0)
    return -1;
  char mid[64] = "";
  bool receipt = false;
  while (!(receipt && done)) {
    json_t *m = next_msg(c, bench_now_ns() + WAIT_NS);
    if (!m)
      return -1;
    uint64_t now = bench_now_ns();
    const char *method = json_string_value(json_object_get(m, "method"));
    json_t *p = json_object_get(m, "params");
    if (!method && json_integer_value(json_object_get(m, "id")) == id) {
      const char *got = json_string_value(json_object_get(json_object_get(m, "result"), "messageId"));
      if (!got) {
        bench_fail(&c->proc, "prompt %lld was refused", (long long)id);
        json_decref(m);
        return -1;
      }
      snprintf(mid, sizeof mid, "%s", got);
      receipt = true;
    } else if (method && strcmp(method, "session.delta") == 0 && !first) {
      first = now;
    } else if (method && strcmp(method, "session.event") == 0) {
      json_t *ev = json_object_get(p, "event");
      const char *kind = json_string_value(json_object_get(ev, "kind"));
      const char *emid = json_string_value(json_object_get(ev, "messageId"));
      if (kind && strcmp(kind, "turn/ended") == 0 && (!mid[0] || (emid && strcmp(emid, mid) == 0)))
        done = now;
    }
    json_decref(m);
  }
  if (!first) {
    bench_fail(&c->proc, "prompt %lld: no session.delta before the turn's end", (long long)id);
    return -1;
  }
  *first_ns = first - t0;
  *done_ns = done - t0;
  return 0;
}

/* stdin EOF, then the exit (status 0) with its rusage. */
static int finish(child *c, long *maxrss_kib) {
  close(c->proc.to_fd);
  c->proc.to_fd = -1;
  uint64_t deadline = bench_now_ns() + WAIT_NS;
  int status = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  for (;;) {
    pid_t got = wait4(c->proc.pid, &status, WNOHANG, &ru);
    if (got == c->proc.pid)
      break;
    if (got < 0 && errno != EINTR) {
      bench_fail(&c->proc, "wait4: %s", strerror(errno));
      child_reap(c);
      return -1;
    }
    if (bench_now_ns() > deadline) {
      bench_fail(&c->proc, "did not exit within %llu s of stdin EOF",
                 (unsigned long long)(WAIT_NS / 1000000000ull));
      child_reap(c);
      return -1;
    }
    /* drain stdout so that the child never blocks on it */
    struct pollfd p = {.fd = c->proc.from_fd, .events = POLLIN};
    if (poll(&p, 1, 2) > 0) {
      char sink[4096];
      if (read(c->proc.from_fd, sink, sizeof sink) < 0 && errno != EINTR && errno != EAGAIN)
        break;
    }
  }
  c->proc.pid = 0;
  child_reap(c);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    bench_fail(&c->proc, "exited with %s %d", WIFEXITED(status) ? "status" : "signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return -1;
  }
  *maxrss_kib = ru.ru_maxrss;
  return 0;
}

typedef struct target {
  const char *label;
  const char *tag; /* names the child's stderr file */
  char *argv[10];
  uint64_t *init_ns;
  long *hwm_kib;
  long *maxrss_kib;
  uint64_t *first_ns;
  uint64_t *done_ns;
} target;

static int spawn_run(target *t, int run) {
  child c = {.proc = {.label = t->label, .to_fd = -1, .from_fd = -1}};
  snprintf(c.proc.log_path, sizeof c.proc.log_path, "%s/%s.stderr", top_dir, t->tag);
  uint64_t t0 = bench_now_ns();
  if (bench_spawn(&c.proc, t->argv) != 0)
    return -1;
  if (initialize(&c) != 0) {
    child_reap(&c);
    return -1;
  }
  t->init_ns[run] = bench_now_ns() - t0;
  char *sid = session_new(&c);
  uint64_t a = 0, b = 0;
  if (!sid || prompt(&c, sid, 3, &a, &b) != 0) {
    free(sid);
    child_reap(&c);
    return -1;
  }
  free(sid);
  t->hwm_kib[run] = bench_status_kib(c.proc.pid, "VmHWM:");
  return finish(&c, &t->maxrss_kib[run]);
}

static int sdk_latency_run(target *t, int n) {
  child c = {.proc = {.label = t->label, .to_fd = -1, .from_fd = -1}};
  snprintf(c.proc.log_path, sizeof c.proc.log_path, "%s/%s-latency.stderr", top_dir, t->tag);
  if (bench_spawn(&c.proc, t->argv) != 0)
    return -1;
  int rc = sdk_initialize(&c);
  uint64_t a = 0, b = 0;
  for (int i = 0; rc == 0 && i < WARMUP; i++)
    rc = sdk_prompt(&c, 10 + i, &a, &b);
  for (int i = 0; rc == 0 && i < n; i++)
    rc = sdk_prompt(&c, 10 + WARMUP + i, &t->first_ns[i], &t->done_ns[i]);
  long rss = 0;
  if (rc != 0) {
    child_reap(&c);
    return -1;
  }
  return finish(&c, &rss);
}

static int latency_run(target *t, int n) {
  child c = {.proc = {.label = t->label, .to_fd = -1, .from_fd = -1}};
  snprintf(c.proc.log_path, sizeof c.proc.log_path, "%s/%s-latency.stderr", top_dir, t->tag);
  if (bench_spawn(&c.proc, t->argv) != 0)
    return -1;
  char *sid = initialize(&c) == 0 ? session_new(&c) : NULL;
  int rc = sid ? 0 : -1;
  uint64_t a = 0, b = 0;
  for (int i = 0; rc == 0 && i < WARMUP; i++)
    rc = prompt(&c, sid, 10 + i, &a, &b);
  for (int i = 0; rc == 0 && i < n; i++)
    rc = prompt(&c, sid, 10 + WARMUP + i, &t->first_ns[i], &t->done_ns[i]);
  free(sid);
  long rss = 0;
  if (rc != 0) {
    child_reap(&c);
    return -1;
  }
  return finish(&c, &rss);
}

int main(int argc, char **argv) {
  bench_prog = "bench_acp";
  if (argc < 4) {
    fprintf(stderr, "usage: %s AGENTHOST NODE CHILD_AGENT_MJS [RUNS [PROMPTS]]\n", argv[0]);
    return 2;
  }
  int runs = argc > 4 ? atoi(argv[4]) : 20;
  int prompts = argc > 5 ? atoi(argv[5]) : 200;
  if (runs < 1 || prompts < 10) {
    fprintf(stderr, "bench_acp: RUNS must be >= 1 and PROMPTS >= 10\n");
    return 2;
  }
  bench_catch_stop_signals();

  /* The Node side needs node and the SDK installed beside the agent (tests/integration/node_modules). */
  const char *node = argv[2];
  const char *agent = argv[3];
  char sdk_dir[1200];
  snprintf(sdk_dir, sizeof sdk_dir, "%s", agent);
  char *slash = strrchr(sdk_dir, '/');
  if (slash)
    *slash = '\0';
  strncat(sdk_dir, "/../node_modules/@agentclientprotocol/sdk/package.json",
          sizeof sdk_dir - strlen(sdk_dir) - 1);
  const char *skip_why = NULL;
  if (!node[0] || access(node, X_OK) != 0)
    skip_why = "node was not found";
  else if (access(agent, R_OK) != 0)
    skip_why = "the child agent script is missing";
  else if (access(sdk_dir, R_OK) != 0)
    skip_why = "the SDK is not installed (tests/integration/node_modules is absent: run scripts/deps.sh)";

  if (bench_mkdtemp(top_dir, sizeof top_dir, getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", "bench-acp") != 0)
    return 1;
  char empty_config[300], stream_config[300], state_dir[300], run_dir[320];
  snprintf(empty_config, sizeof empty_config, "%s/empty.ini", top_dir);
  snprintf(stream_config, sizeof stream_config, "%s/stream.ini", top_dir);
  snprintf(state_dir, sizeof state_dir, "%s/state", top_dir);
  snprintf(run_dir, sizeof run_dir, "%s/run", state_dir);
  FILE *f = fopen(empty_config, "w");
  if (f)
    fclose(f);
  f = fopen(stream_config, "w");
  if (f) {
    fputs("[plugin.acp]\nstream_deltas = true\n", f);
    fclose(f);
  }

  target ah = {.label = "agenthost acp", .tag = "agenthost"};
  target nd = {.label = "Node ACP agent (official SDK)", .tag = "node"};
  ah.argv[0] = argv[1];
  ah.argv[1] = "--state-dir";
  ah.argv[2] = state_dir;
  ah.argv[3] = "--runtime-dir";
  ah.argv[4] = run_dir;
  ah.argv[5] = "--config";
  ah.argv[6] = empty_config;
  ah.argv[7] = "acp";
  nd.argv[0] = (char *)node;
  nd.argv[1] = (char *)agent;
  target st = ah; /* the same, streaming deltas: latency only */
  st.label = "agenthost acp, stream_deltas";
  st.tag = "agenthost-stream";
  st.argv[6] = stream_config;
  target sd = ah; /* the SDK surface, capabilities.deltas: latency only */
  sd.label = "agenthost sdk, deltas";
  sd.tag = "agenthost-sdk";
  sd.argv[7] = "sdk";
  target *all[4] = {&ah, &nd, &st, &sd};
  int kinds = skip_why ? 1 : 2;
  for (int i = 0; i < 4; i++) {
    all[i]->init_ns = calloc((size_t)runs, sizeof(uint64_t));
    all[i]->hwm_kib = calloc((size_t)runs, sizeof(long));
    all[i]->maxrss_kib = calloc((size_t)runs, sizeof(long));
    all[i]->first_ns = calloc((size_t)prompts, sizeof(uint64_t));
    all[i]->done_ns = calloc((size_t)prompts, sizeof(uint64_t));
    if (!all[i]->init_ns || !all[i]->hwm_kib || !all[i]->maxrss_kib || !all[i]->first_ns || !all[i]->done_ns)
      return 1;
  }

  int errors = 0;
  for (int r = 0; r < runs && !errors; r++)
    for (int i = 0; i < kinds && !errors; i++)
      errors += spawn_run(all[i], r) != 0;
  for (int i = 0; i < kinds && !errors; i++)
    errors += latency_run(all[i], prompts) != 0;
  if (!errors)
    errors += latency_run(&st, prompts) != 0;
  if (!errors)
    errors += sdk_latency_run(&sd, prompts) != 0;

  bench_rm_tree(top_dir);
  if (bench_stopped(errors))
    return 1;

  double med[2] = {0}, p90[2] = {0};
  long hwm_med[2] = {0}, rss_med[2] = {0}, rss_p90[2] = {0}, rss_max[2] = {0};
  for (int i = 0; i < kinds; i++) {
    target *t = all[i];
    qsort(t->init_ns, (size_t)runs, sizeof(uint64_t), bench_cmp_u64);
    qsort(t->hwm_kib, (size_t)runs, sizeof(long), bench_cmp_long);
    qsort(t->maxrss_kib, (size_t)runs, sizeof(long), bench_cmp_long);
    med[i] = (double)t->init_ns[bench_rank((size_t)runs, 50)] / 1e6;
    p90[i] = (double)t->init_ns[bench_rank((size_t)runs, 90)] / 1e6;
    hwm_med[i] = t->hwm_kib[bench_rank((size_t)runs, 50)];
    rss_med[i] = t->maxrss_kib[bench_rank((size_t)runs, 50)];
    rss_p90[i] = t->maxrss_kib[bench_rank((size_t)runs, 90)];
    rss_max[i] = t->maxrss_kib[runs - 1];
  }

  printf("ACP surface: `agenthost acp` against a Node ACP agent on the official SDK, same run\n");
  printf("agenthost: %s --state-dir D --runtime-dir D/run --config EMPTY acp (echo provider)\n", argv[1]);
  if (skip_why)
    printf("Node:      skipped: %s\n\n", skip_why);
  else
    printf("Node:      %s %s\n\n", node, agent);

  printf("1. spawn -> initialize answered (%d fresh processes of each kind, interleaved)\n", runs);
  printf("   %-32s %10s %10s\n", "", "median", "p90");
  for (int i = 0; i < kinds; i++)
    printf("   %-32s %7.2f ms %7.2f ms\n", all[i]->label, med[i], p90[i]);
  if (!skip_why) {
    printf("   %-32s %9.1fx %9.1fx\n", "ratio Node / agenthost", med[1] / med[0], p90[1] / p90[0]);
    printf("   target agenthost >= 10x faster (median): %s\n", bench_verdict(med[1] / med[0] >= 10.0));
  }
  printf("\n   peak RSS (wait4 ru_maxrss over the whole life: initialize, session/new, one prompt, exit;\n"
         "   VmHWM read before stdin EOF in parentheses)\n");
  printf("   %-32s %10s %10s %10s %14s\n", "", "median", "p90", "max", "(VmHWM median)");
  for (int i = 0; i < kinds; i++)
    printf("   %-32s %6ld KiB %6ld KiB %6ld KiB %10ld KiB\n", all[i]->label, rss_med[i], rss_p90[i],
           rss_max[i], hwm_med[i]);
  if (!skip_why)
    printf("   %-32s %9.1fx\n", "ratio Node / agenthost", (double)rss_med[1] / (double)rss_med[0]);
  printf("   target agenthost peak RSS <= 8 MB (8192 KiB, max): %s\n", bench_verdict(rss_max[0] <= 8192));

  printf("\n2. prompt -> first agent_message_chunk (one process each, one session, %d warm-up prompts,\n"
         "   then %d prompts \"echo hi\" one at a time; agenthost runs its echo provider; the SDK's first "
         "chunk\n"
         "   is its first session.delta and its end the turn/ended event, ACP's end the stopReason)\n",
         WARMUP, prompts);
  printf("   %-32s %10s %10s %10s %14s\n", "", "median", "p99", "max", "end p50");
  int order[4] = {0, 2, 3, 1}, shown = skip_why ? 3 : 4;
  double first_med[4] = {0};
  for (int k = 0; k < shown; k++) {
    int i = order[k];
    target *t = all[i];
    qsort(t->first_ns, (size_t)prompts, sizeof(uint64_t), bench_cmp_u64);
    qsort(t->done_ns, (size_t)prompts, sizeof(uint64_t), bench_cmp_u64);
    first_med[i] = (double)t->first_ns[bench_rank((size_t)prompts, 50)] / 1e3;
    printf("   %-32s %7.1f us %7.1f us %7.1f us %11.1f us\n", t->label, first_med[i],
           (double)t->first_ns[bench_rank((size_t)prompts, 99)] / 1e3, (double)t->first_ns[prompts - 1] / 1e3,
           (double)t->done_ns[bench_rank((size_t)prompts, 50)] / 1e3);
  }
  if (!skip_why) {
    printf("   target first chunk at or below the Node agent's (median), stream_deltas: %s (%.2fx)\n",
           bench_verdict(first_med[2] <= first_med[1]), first_med[2] / first_med[1]);
    printf("   the same, committed messages whole (the default): %s (%.2fx)\n",
           bench_verdict(first_med[0] <= first_med[1]), first_med[0] / first_med[1]);
    printf("   the same through the SDK (first session.delta, capabilities.deltas): %s (%.2fx)\n",
           bench_verdict(first_med[3] <= first_med[1]), first_med[3] / first_med[1]);
  }
  for (int i = 0; i < 4; i++) {
    free(all[i]->init_ns);
    free(all[i]->hwm_kib);
    free(all[i]->maxrss_kib);
    free(all[i]->first_ns);
    free(all[i]->done_ns);
  }
  return 0;
}
