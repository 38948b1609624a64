/* Benchmark: remote.invoke round trips against a plain method over the same carrier (the core's dispatch,
 * which every surface uses), issue #7's target: the libffi path at most 10 % slower.
 *
 * One host on one loop with the `ok` fixture (plain method ok.add {a, b} → {sum}), the `remote-types`
 * fixture (descriptor types.add_like: echo_int(i) → i) and the remote plugin. Each round trip is one
 * dispatch answered on a later loop turn, sequential (the next starts in the previous one's callback), so
 * the figure is the per-call cost of the path, not of batching. Blocks of N calls alternate between
 *   plain    ok.add                         (a method handler replying with a small object)
 *   remote   remote.invoke types.echo_int   (envelope check, lookup again, exact field set, libffi call,
 *                                           result check, reply through the remote plugin's call)
 * and the median block of each is reported, with the ratio remote/plain.
 *
 * Then the same comparison over a real carrier: a daemon (`agenthost serve`) and one persistent JSON-RPC
 * connection on its admin socket, one request in flight, so each round trip also pays the socket, the
 * framing and the JSON text both ways — what every remote client pays. The target applies to this figure.
 *
 * usage: bench_remote PLUGIN_DIR REMOTE_SO [AGENTHOST] [N] [BLOCKS]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "host.h"
#include "log.h"

typedef struct run {
  ah_host *h;
  const char *method;
  bool remote;
  long left;
  long errors;
  bool done;
} run;

static const ah_caller caller = {
    .struct_size = sizeof(ah_caller), .authority = AH_AUTH_LAN, .surface = "bench"};

static void next(run *r);

static void on_reply(const ah_outcome *o, void *arg) {
  run *r = arg;
  if (o->status != 0)
    r->errors++;
  if (--r->left == 0) {
    r->done = true;
    return;
  }
  next(r);
}

static void next(run *r) {
  json_t *params =
      r->remote ? json_pack("{s:s, s:s, s:{s:i}}", "namespace", "types", "method", "echo_int", "args", "i", 7)
                : json_pack("{s:i, s:i}", "a", 3, "b", 4);
  int rc = ah__host_dispatch(r->h, &caller, r->method, params, NULL, on_reply, r);
  if (rc) {
    fprintf(stderr, "dispatch %s: %s\n", r->method, ah_strerror(rc));
    exit(1);
  }
}

static double block(uv_loop_t *loop, ah_host *h, bool remote, long n) {
  run r = {.h = h, .method = remote ? "remote.invoke" : "ok.add", .remote = remote, .left = n};
  uint64_t t0 = bench_now_ns();
  next(&r);
  while (!r.done)
    uv_run(loop, UV_RUN_ONCE);
  uint64_t dt = bench_now_ns() - t0;
  if (r.errors) {
    fprintf(stderr, "%ld %s calls failed\n", r.errors, r.method);
    exit(1);
  }
  return (double)n * 1e9 / (double)dt;
}

static void stopped(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median block of each path (blocks of n round trips/s, sorted here), its spread and the ratio. */
static void report(const char *what, double *plain, double *remote, int blocks, long n) {
  qsort(plain, (size_t)blocks, sizeof plain[0], cmp_double);
  qsort(remote, (size_t)blocks, sizeof remote[0], cmp_double);
  double p = plain[blocks / 2], r = remote[blocks / 2];
  printf("%s (%d alternating blocks of %ld sequential round trips, median):\n", what, blocks, n);
  printf("  plain method ok.add                   %10.0f round trips/s  (%.2f us each; min %.0f, max %.0f)\n",
         p, 1e6 / p, plain[0], plain[blocks - 1]);
  printf("  remote.invoke types.echo_int (libffi) %10.0f round trips/s  (%.2f us each; min %.0f, max %.0f)\n",
         r, 1e6 / r, remote[0], remote[blocks - 1]);
  printf("  remote / plain throughput: %.3f  (libffi path %.1f %% slower; target <= 10 %%)\n", r / p,
         (1.0 - r / p) * 100.0);
}

static void load(ah_host *h, const char *path) {
  char *why = NULL;
  int rc = ah__host_load(h, path, NULL, NULL, &why);
  if (rc) {
    fprintf(stderr, "cannot load %s: %s\n", path, why ? why : ah_strerror(rc));
    exit(1);
  }
  free(why);
}

/* ---- over the admin socket of a real daemon --------------------------------------------------------- */

typedef struct conn {
  int fd;
  char buf[65536];
  size_t len;
  long id;
} conn;

/* One request, one answer line; returns true when the answer has a "result". */
static bool rpc(conn *c, const char *method, const char *params) {
  char line[2048];
  int n = snprintf(line, sizeof line, "{\"jsonrpc\":\"2.0\",\"id\":%ld,\"method\":\"%s\",\"params\":%s}\n",
                   ++c->id, method, params);
  for (int off = 0; off < n;) {
    ssize_t w = write(c->fd, line + off, (size_t)(n - off));
    if (w <= 0)
      return false;
    off += (int)w;
  }
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl) {
      size_t used = (size_t)(nl - c->buf) + 1;
      bool ok = strstr(c->buf, "\"result\"") && strstr(c->buf, "\"result\"") < nl;
      memmove(c->buf, c->buf + used, c->len - used);
      c->len -= used;
      return ok;
    }
    if (c->len == sizeof c->buf)
      return false;
    ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
    if (r <= 0)
      return false;
    c->len += (size_t)r;
  }
}

static double socket_block(conn *c, bool remote, long n) {
  const char *method = remote ? "remote.invoke" : "ok.add";
  const char *params =
      remote ? "{\"namespace\":\"types\",\"method\":\"echo_int\",\"args\":{\"i\":7}}" : "{\"a\":3,\"b\":4}";
  uint64_t t0 = bench_now_ns();
  for (long i = 0; i < n; i++)
    if (!rpc(c, method, params)) {
      fprintf(stderr, "%s failed over the admin socket\n", method);
      exit(1);
    }
  return (double)n * 1e9 / (double)(bench_now_ns() - t0);
}

static void over_socket(const char *agenthost, const char *plugin_dir, long n, int blocks) {
  char dir[] = "/tmp/ah-bench-remote-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  char cfg[4200], state[4200], run[4200], sock[4300];
  snprintf(cfg, sizeof cfg, "%s/agenthost.ini", dir);
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(run, sizeof run, "%s/run", dir);
  snprintf(sock, sizeof sock, "%s/admin.sock", run);
  FILE *f = fopen(cfg, "w");
  if (!f)
    exit(1);
  fputs("[plugin.browser]\nenabled = false\n[host]\nlog_level = error\n", f);
  fclose(f);
  pid_t pid = fork();
  if (pid == 0) {
    execl(agenthost, agenthost, "--config", cfg, "--state-dir", state, "--runtime-dir", run, "serve",
          (char *)NULL);
    _exit(127);
  }
  conn c = {.fd = -1};
  for (int i = 0; i < 500 && c.fd < 0; i++) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sa.sun_path) {
      fprintf(stderr, "socket path too long: %s\n", sock);
      exit(1);
    }
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
      c.fd = fd;
    else {
      close(fd);
      usleep(10000);
    }
  }
  if (c.fd < 0) {
    fprintf(stderr, "the daemon's admin socket did not appear\n");
    kill(pid, SIGKILL);
    exit(1);
  }
  char params[4400];
  snprintf(params, sizeof params, "{\"path\":\"%s/ok.so\"}", plugin_dir);
  bool ok = rpc(&c, "plugin.load", params);
  snprintf(params, sizeof params, "{\"path\":\"%s/remote-types.so\"}", plugin_dir);
  ok = ok && rpc(&c, "plugin.load", params);
  if (!ok) {
    fprintf(stderr, "cannot load the fixtures into the daemon\n");
    kill(pid, SIGKILL);
    exit(1);
  }
  socket_block(&c, false, n / 10 + 1);
  socket_block(&c, true, n / 10 + 1);
  double plain[100], remote[100];
  for (int b = 0; b < blocks; b++) {
    plain[b] = socket_block(&c, false, n);
    remote[b] = socket_block(&c, true, n);
  }
  report("over a carrier: one JSON-RPC connection on the daemon's admin socket", plain, remote, blocks, n);
  close(c.fd);
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  char rm[4300];
  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  if (system(rm) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s PLUGIN_DIR REMOTE_SO [AGENTHOST] [N] [BLOCKS]\n", argv[0]);
    return 2;
  }
  const char *agenthost = argc > 3 && argv[3][0] ? argv[3] : NULL;
  long n = argc > 4 ? atol(argv[4]) : 20000;
  int blocks = argc > 5 ? atoi(argv[5]) : 15;
  if (n < 1 || blocks < 1 || blocks > 100)
    return 2;
  ah__log_set_level(AH_LOG_ERROR);
  uv_loop_t loop;
  uv_loop_init(&loop);
  ah_host *h = NULL;
  ah_host_opts opts = {.loop = &loop, .mode = "serve"};
  if (ah__host_new(&opts, &h) != 0)
    return 1;
  char path[4096];
  snprintf(path, sizeof path, "%s/ok.so", argv[1]);
  load(h, path);
  snprintf(path, sizeof path, "%s/remote-types.so", argv[1]);
  load(h, path);
  load(h, argv[2]);
  /* Warm up both paths. */
  block(&loop, h, false, n / 10 + 1);
  block(&loop, h, true, n / 10 + 1);
  double plain[100], remote[100];
  for (int b = 0; b < blocks; b++) {
    plain[b] = block(&loop, h, false, n);
    remote[b] = block(&loop, h, true, n);
  }
  report("remote gateway over the core dispatch", plain, remote, blocks, n);
  if (agenthost)
    over_socket(agenthost, argv[1], n / 4, blocks);
  bool done = false;
  if (ah__host_stop(h, stopped, &done) == 0)
    while (!done)
      uv_run(&loop, UV_RUN_ONCE);
  ah__host_free(h);
  uv_run(&loop, UV_RUN_DEFAULT);
  return uv_loop_close(&loop) == 0 ? 0 : 1;
}
