/* The WebSocket fan-out benchmark of the browser surface (issue 6): N WebSocket clients on the mux of one
 * session while the session streams deltas at a fixed rate, plus one client that never reads.
 *
 * The event source is the fixture provider `bench-stream` (tests/plugins/bench-stream.c): a turn
 * "stream RATE SECONDS" emits RATE deltas per second, each carrying t=<CLOCK_MONOTONIC ns> taken at the emit
 * into the host's bus. Every client parses every frame and records now(CLOCK_MONOTONIC) - t when the frame
 * has been read (client and daemon share the machine's monotonic clock), so the figure is emit → frame
 * read by the client: bus delivery, envelope, fan-out queue, libwebsockets, the kernel and this client's
 * own loop (one thread, one epoll set, on the same machine as the daemon).
 *
 * The clients ask for batches (?batch=1, several envelopes to a message as the web UI does) unless
 * --no-batch. For each rate it prints: delta frames expected and received per client (min/max), p50/p99/max
 * emit→frame latency over all clients, frames/s delivered in total, whether the slow client was closed 1013
 * (it gets a small receive buffer and is read only after the run) and whether any other client was closed,
 * and the daemon's VmRSS before, at the peak, at the end and after a settle time; then the RSS once every
 * client is closed, against the baseline taken before the clients connected. A verdict per target follows.
 *
 * usage: bench_browser_fanout AGENTHOST BENCH_STREAM_SO BROWSER_SO [options]   start a daemon
 *        bench_browser_fanout --url LAUNCH_URL [--pid PID] [--provider NAME] [options]
 *            use a running `agenthost serve` (LAUNCH_URL as it prints it, with #k=TOKEN) whose provider
 *            NAME (default "bench") has the type of the bench-stream fixture; RSS needs --pid
 * options: --clients N (100)  --rates R1,R2,… (1000,2500,5000,10000)  --seconds S (5)  --settle S (3)
 *          --queue-bytes B (the daemon's ws_queue_bytes: set when this program starts the daemon, assumed
 *          with --url; default: the plugin's default, 8 MiB)  --target-ms MS (5)
 *          --no-batch: the clients ask for one envelope per message (without ?batch=1)
 *          --floor BIN: then the same runs against BIN (bench/browser_broadcast_bare.c, a bare libwebsockets
 *          broadcast of the same envelopes, fanned out the same way), and the host's frames/s against the
 *          floor's at each rate (target: at least 70 %)
 *          --abuse N: instead, the hostile-use figures (N idle connections, non-reading replay sockets)
 *          --big-prompt MIB: instead, the large-prompt figures, for a prompt of MIB MiB
 * The slow client can be closed only when a run sends it more than the queue plus what the kernel holds
 * for it (read from /proc/net/tcp); below that its check is printed as n/a.
 * Exits 0 when it ran (whatever the verdicts), 1 when it could not run, 77 when the daemon cannot start.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ws_client.h"

/* ---- clock, histogram ----------------------------------------------------------------------------------
 */

#define HIST_STEP_NS 10000u   /* 10 µs buckets */
#define HIST_BUCKETS 6000000u /* up to 60 s; later samples go in the last bucket (max is kept apart) */

typedef struct hist {
  uint32_t *b;
  uint64_t n;
  uint64_t max_ns;
} hist;

static void hist_add(hist *h, int64_t ns) {
  if (ns < 0)
    ns = 0;
  uint64_t i = (uint64_t)ns / HIST_STEP_NS;
  h->b[i < HIST_BUCKETS ? i : HIST_BUCKETS - 1]++;
  h->n++;
  if ((uint64_t)ns > h->max_ns)
    h->max_ns = (uint64_t)ns;
}

/* The q-quantile in ms (upper edge of its bucket). */
static double hist_q(const hist *h, double q) {
  if (!h->n)
    return 0;
  uint64_t want = (uint64_t)((double)h->n * q);
  if (want >= h->n)
    want = h->n - 1;
  uint64_t seen = 0;
  for (uint64_t i = 0; i < HIST_BUCKETS; i++) {
    seen += h->b[i];
    if (seen > want) {
      double edge = (double)((i + 1) * HIST_STEP_NS) / 1e6;
      double max = (double)h->max_ns / 1e6;
      return edge < max ? edge : max;
    }
  }
  return (double)h->max_ns / 1e6;
}

/* ---- the daemon -----------------------------------------------------------------------------------------
 */

typedef struct daemon_ctl {
  pid_t pid;     /* > 0 when this program started it */
  pid_t rss_pid; /* whose VmRSS to read (0: none) */
  int out_fd;    /* its stdout */
  char dir[256]; /* temporary directory (state, runtime, config) */
  int port;
  char token[128];
  const char *provider;
} daemon_ctl;

static long rss_kib(pid_t pid) {
  return pid > 0 ? bench_status_kib(pid, "VmRSS:") : -1;
}

/* utime + stime of a process in seconds, or -1. */
static double cpu_s(pid_t pid) {
  if (pid <= 0)
    return -1;
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the command may contain spaces */
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec / 1e6;
}

/* Parse "http://HOST:PORT/...#k=TOKEN". */
static bool parse_url(const char *url, int *port, char *token, size_t cap) {
  const char *p = strstr(url, "://");
  const char *k = strstr(url, "#k=");
  if (!p || !k)
    return false;
  p += 3;
  const char *colon = NULL;
  for (const char *c = p; *c && *c != '/'; c++)
    if (*c == ':')
      colon = c;
  if (!colon)
    return false;
  *port = atoi(colon + 1);
  size_t n = strcspn(k + 3, " \r\n\t");
  if (n == 0 || n >= cap || *port <= 0)
    return false;
  memcpy(token, k + 3, n);
  token[n] = '\0';
  return true;
}

static void stop_daemon(daemon_ctl *d) {
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 200; i++) {
      if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
        d->pid = 0;
        break;
      }
      usleep(50000);
    }
    if (d->pid > 0) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &status, 0);
      d->pid = 0;
    }
  }
  if (d->out_fd >= 0)
    close(d->out_fd);
  d->out_fd = -1;
  if (d->dir[0])
    bench_rm_tree(d->dir);
  d->dir[0] = '\0';
}

static bool write_config(const daemon_ctl *d, const char *fixture, const char *browser, const char *queue) {
  char path[512];
  snprintf(path, sizeof path, "%s/agenthost.ini", d->dir);
  FILE *f = fopen(path, "w");
  if (!f)
    return false;
  /* plugin_dir is an empty directory: only the two modules named here are mounted. */
  fprintf(f,
          "[host]\nstate_dir = %s/state\nruntime_dir = %s/run\nplugin_dir = %s/plugins\nlog_level = warn\n\n"
          "[plugin.browser]\npath = %s\nlisten = 127.0.0.1:0\n%s%s%s\n"
          "[plugin.bench-stream]\npath = %s\nenabled = yes\nmodes = serve\n\n"
          "[provider.bench]\ntype = bench-stream\n",
          d->dir, d->dir, d->dir, browser, queue ? "ws_queue_bytes = " : "", queue ? queue : "",
          queue ? "\n" : "", fixture);
  return fclose(f) == 0;
}

/* Spawn `argv` and read the launch URL from its stdout (stderr to DIR/host.err). Returns 0, 1 on failure,
 * 2 when the configuration was refused (it exited with status 2). */
static int spawn_server(daemon_ctl *d, char *const argv[]) {
  char err[512];
  snprintf(err, sizeof err, "%s/host.err", d->dir);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0)
    return 1;
  pid_t pid = fork();
  if (pid < 0)
    return 1;
  if (pid == 0) {
    int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(pipefd[1], 1);
    if (e >= 0)
      dup2(e, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  close(pipefd[1]);
  d->pid = pid;
  d->rss_pid = pid;
  d->out_fd = pipefd[0];
  char buf[4096];
  size_t len = 0;
  uint64_t deadline = bench_now_ns() + 15000000000u;
  while (bench_now_ns() < deadline && len + 1 < sizeof buf) {
    struct pollfd p = {.fd = d->out_fd, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r > 0) {
      ssize_t n = read(d->out_fd, buf + len, sizeof buf - 1 - len);
      if (n <= 0) { /* its stdout closed: it exited (or is about to) */
        int status = 0;
        if (waitpid(pid, &status, 0) == pid)
          d->pid = 0;
        return d->pid == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1;
      }
      len += (size_t)n;
      buf[len] = '\0';
      if (strchr(buf, '\n') && strstr(buf, "#k=") && parse_url(buf, &d->port, d->token, sizeof d->token))
        return 0;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->pid = 0;
      return WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1;
    }
  }
  return 1;
}

/* `agenthost --config DIR/agenthost.ini serve`. */
static int spawn_daemon(daemon_ctl *d, const char *agenthost) {
  char cfg[512];
  snprintf(cfg, sizeof cfg, "%s/agenthost.ini", d->dir);
  char *const argv[] = {(char *)agenthost, "--config", cfg, "serve", NULL};
  return spawn_server(d, argv);
}

static void print_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  char line[1024];
  while (fgets(line, sizeof line, f))
    fprintf(stderr, "  | %s", line);
  fclose(f);
}

/* Start a daemon with the browser plugin on an ephemeral port and the bench-stream fixture behind the
 * configured provider "bench" (type bench-stream). */
static int start_daemon(daemon_ctl *d, const char *agenthost, const char *fixture, const char *browser,
                        const char *queue) {
  const char *tmp = getenv("TMPDIR");
  snprintf(d->dir, sizeof d->dir, "%s/ah-fanout-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(d->dir)) {
    d->dir[0] = '\0';
    return 1;
  }
  char sub[300];
  snprintf(sub, sizeof sub, "%s/plugins", d->dir);
  mkdir(sub, 0700);
  snprintf(sub, sizeof sub, "%s/state", d->dir);
  mkdir(sub, 0700);
  d->provider = "bench";
  if (!write_config(d, fixture, browser, queue))
    return 1;
  if (spawn_daemon(d, agenthost) == 0)
    return 0;
  char err[512];
  snprintf(err, sizeof err, "%s/host.err", d->dir);
  fprintf(stderr, "browser fanout: agenthost serve did not start:\n");
  print_file(err);
  return 1;
}

/* ---- HTTP -----------------------------------------------------------------------------------------------
 */

/* POST /api/METHOD with a client-request envelope; returns the value (new reference) or NULL (printed). */
static json_t *api_call(const daemon_ctl *d, const char *method, json_t *payload) {
  static unsigned rpc;
  json_t *env = json_pack("{s:s, s:s, s:s, s:o}", "kind", "client-request", "rpcId", "", "method", method,
                          "payload", payload);
  char id[32];
  snprintf(id, sizeof id, "fanout-%u", ++rpc);
  json_object_set_new(env, "rpcId", json_string(id));
  char *body = json_dumps(env, JSON_COMPACT);
  json_decref(env);
  char head[1024];
  snprintf(head, sizeof head,
           "POST /api/%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
           "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
           method, d->port, d->token, strlen(body));
  int fd = tc_connect(d->port, 0);
  tc_resp r = {0};
  int status =
      fd >= 0 && tc_send_str(fd, head) && tc_send_str(fd, body) ? tc_read_response(fd, &r, 30000) : -1;
  free(body);
  if (fd >= 0)
    close(fd);
  json_t *res = status == 200 ? json_loadb(r.body, r.body_len, 0, NULL) : NULL;
  json_t *value = json_incref(json_object_get(res, "value"));
  if (!value)
    fprintf(stderr, "browser fanout: %s: HTTP %d %s\n", method, status, r.body ? r.body : "");
  json_decref(res);
  tc_resp_free(&r);
  return value;
}

/* ---- WebSocket clients ----------------------------------------------------------------------------------
 */

typedef struct client {
  int fd;
  bool slow;
  bool in_epoll;
  char *buf;
  size_t len, cap;
  uint64_t deltas;    /* delta frames of the current run */
  uint64_t bytes;     /* bytes read in the current run */
  bool turn_ended;    /* saw the turn/ended event of the current run */
  int close_code;     /* 0: open; else the close frame's code, or -1 for EOF/reset without one */
  uint64_t closed_ns; /* when it was seen closed */
} client;

typedef struct run {
  hist h;
  const char *session;
  uint64_t first_ns, last_ns; /* first and last delta read, any client */
} run;

static int open_mux_at(const daemon_ctl *d, const char *path, int rcvbuf) {
  char extra[512];
  snprintf(extra, sizeof extra, "Sec-WebSocket-Protocol: agenthost.v1, agenthost.bearer.%s\r\n", d->token);
  tc_resp hs = {0};
  int fd = tc_ws_open(d->port, path, extra, &hs, rcvbuf);
  if (fd < 0 && hs.head)
    fprintf(stderr, "browser fanout: the mux upgrade was refused: %.*s\n", (int)strcspn(hs.head, "\r\n"),
            hs.head);
  tc_resp_free(&hs);
  if (fd >= 0)
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static bool batch = true; /* --no-batch: one envelope per message, as before ?batch=1 existed */

static int open_mux(const daemon_ctl *d, int rcvbuf) {
  return open_mux_at(d, batch ? "/api/ws/mux?batch=1" : "/api/ws/mux", rcvbuf);
}

/* The send queue of the daemon's side of the TCP connection whose client end is `fd` (IPv4 loopback). */
static uint64_t server_send_q(int port, int fd) {
  struct sockaddr_in a;
  socklen_t alen = sizeof a;
  if (getsockname(fd, (struct sockaddr *)&a, &alen) != 0)
    return 0;
  unsigned cport = ntohs(a.sin_port);
  FILE *f = fopen("/proc/net/tcp", "r");
  if (!f)
    return 0;
  char line[512];
  uint64_t q = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned lport = 0, rport = 0;
    unsigned long tx = 0;
    if (sscanf(line, " %*d: %*8x:%x %*8x:%x %*x %lx", &lport, &rport, &tx) == 3 && (int)lport == port &&
        rport == cport)
      q = tx;
  }
  fclose(f);
  return q;
}

static void client_closed(int ep, client *c, int code) {
  if (c->close_code)
    return;
  c->close_code = code;
  c->closed_ns = bench_now_ns();
  if (c->in_epoll)
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  c->in_epoll = false;
  close(c->fd);
  c->fd = -1;
}

static void on_envelope(client *c, run *r, const char *p, size_t n, uint64_t now) {
  static const char delta[] = "\"method\":\"session.delta\"";
  static const char text[] = "\"text\":\"t=";
  if (memmem(p, n, delta, sizeof delta - 1)) {
    const char *t = memmem(p, n, text, sizeof text - 1);
    if (!t)
      return;
    t += sizeof text - 1;
    uint64_t ns = 0;
    while (t < p + n && *t >= '0' && *t <= '9')
      ns = ns * 10 + (uint64_t)(*t++ - '0');
    c->deltas++;
    if (!c->slow) {
      hist_add(&r->h, (int64_t)(now - ns));
      if (!r->first_ns)
        r->first_ns = now;
      r->last_ns = now;
    }
    return;
  }
  if (memmem(p, n, "\"kind\":\"turn/ended\"", 19) && memmem(p, n, r->session, strlen(r->session)))
    c->turn_ended = true;
}

/* One text message: one envelope, or (?batch=1) a JSON array of them, each starting with its kind. */
static void on_text(client *c, run *r, const char *p, size_t n, uint64_t now) {
  static const char start[] = "{\"kind\":\"server-request\"";
  const char *end = p + n;
  const char *e = memmem(p, n, start, sizeof start - 1);
  if (!e) {
    on_envelope(c, r, p, n, now);
    return;
  }
  while (e) {
    const char *next = memmem(e + 1, (size_t)(end - e - 1), start, sizeof start - 1);
    on_envelope(c, r, e, (size_t)((next ? next : end) - e), now);
    e = next;
  }
}

/* Parse the complete frames in c->buf (server frames are not masked). */
static void parse_frames(int ep, client *c, run *r, uint64_t now) {
  size_t off = 0;
  while (c->len - off >= 2) {
    const unsigned char *h = (const unsigned char *)c->buf + off;
    int opcode = h[0] & 0x0f;
    uint64_t n = h[1] & 0x7f;
    size_t hl = 2;
    if (n == 126) {
      if (c->len - off < 4)
        break;
      n = ((uint64_t)h[2] << 8) | h[3];
      hl = 4;
    } else if (n == 127) {
      if (c->len - off < 10)
        break;
      n = 0;
      for (int i = 0; i < 8; i++)
        n = (n << 8) | h[2 + i];
      hl = 10;
    }
    if (h[1] & 0x80)
      hl += 4; /* a masked server frame is a protocol error; skip the key all the same */
    if (c->len - off < hl + n) {
      if (hl + n > c->cap) { /* a frame larger than the buffer: grow it */
        size_t cap = c->cap;
        while (cap < hl + n)
          cap *= 2;
        char *nb = realloc(c->buf, cap);
        if (!nb)
          abort();
        c->buf = nb;
        c->cap = cap;
      }
      break;
    }
    const char *payload = c->buf + off + hl;
    if (opcode == 1 || opcode == 0) {
      on_text(c, r, payload, n, now);
    } else if (opcode == 8) {
      c->len = 0;
      client_closed(ep, c, tc_ws_close_code(payload, n));
      return;
    } else if (opcode == 9) {
      tc_ws_send(c->fd, 0xA, payload, n); /* pong (a control frame, allowed on a downlink socket) */
    }
    off += hl + n;
  }
  if (off) {
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
  }
}

/* One read of what the socket has (up to the free buffer), then parse it. */
static void client_read(int ep, client *c, run *r) {
  if (c->fd < 0)
    return;
  ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (n <= 0) {
    client_closed(ep, c, -1);
    return;
  }
  uint64_t now = bench_now_ns();
  c->len += (size_t)n;
  c->bytes += (uint64_t)n;
  parse_frames(ep, c, r, now);
}

static bool client_init(client *c, int fd, bool slow) {
  memset(c, 0, sizeof *c);
  c->fd = fd;
  c->slow = slow;
  c->cap = 1u << 18;
  c->buf = malloc(c->cap);
  return c->buf != NULL;
}

static bool watch(int ep, client *c) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
  c->in_epoll = epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) == 0;
  return c->in_epoll;
}

/* ---- the run --------------------------------------------------------------------------------------------
 */

typedef struct result {
  double rate;
  uint64_t expected, min_frames, max_frames;
  double p50, p99, p999, max;
  double fps;
  int slow_code; /* 0 open, -1 EOF without a close frame, else the code */
  double slow_mib_read;
  double kernel_mib; /* held by the kernel for the slow client when the run ended */
  double sent_mib;   /* what a fast client got, i.e. what the daemon tried to send the slow one */
  bool slow_applies; /* the bytes sent to it exceeded its queue */
  int others_closed;
  bool complete; /* every fast client saw the turn end */
  long rss_before, rss_peak, rss_end, rss_settled;
  double cpu_daemon, cpu_client; /* % of one CPU from the prompt to the last client's turn end */
  double wall;                   /* that time, s */
} result;

static void sample_rss(const daemon_ctl *d, long *peak) {
  long r = rss_kib(d->rss_pid);
  if (r > *peak)
    *peak = r;
}

static void pump(int ep, run *r, int timeout_ms) {
  struct epoll_event evs[256];
  int n = epoll_wait(ep, evs, 256, timeout_ms);
  for (int i = 0; i < n; i++)
    client_read(ep, evs[i].data.ptr, r);
}

static bool run_rate(const daemon_ctl *d, int ep, client *cs, int nc, run *r, double rate, double secs,
                     double settle, size_t queue_bytes, result *out) {
  memset(out, 0, sizeof *out);
  out->rate = rate;
  out->expected = (uint64_t)(rate * secs + 0.5);
  memset(r->h.b, 0, HIST_BUCKETS * sizeof *r->h.b);
  r->h.n = r->h.max_ns = 0;
  r->first_ns = r->last_ns = 0;
  for (int i = 0; i < nc; i++) {
    cs[i].deltas = cs[i].bytes = 0;
    cs[i].turn_ended = false;
  }
  /* The slow client: a 4 KiB receive buffer, not read until the run is over. */
  client slow;
  int sfd = open_mux(d, 4096);
  if (sfd < 0 || !client_init(&slow, sfd, true)) {
    fprintf(stderr, "browser fanout: cannot open the slow client\n");
    return false;
  }
  out->rss_before = rss_kib(d->rss_pid);
  double cpu_d0 = cpu_s(d->rss_pid), cpu_c0 = self_cpu_s();
  out->rss_peak = out->rss_before;

  char prompt[64];
  snprintf(prompt, sizeof prompt, "stream %g %g", rate, secs);
  json_t *v = api_call(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", r->session, "text", prompt));
  if (!v) {
    close(sfd);
    free(slow.buf);
    return false;
  }
  json_decref(v);
  uint64_t start = bench_now_ns();
  uint64_t deadline = start + (uint64_t)((secs + 60) * 1e9);
  uint64_t next_rss = start;
  for (;;) {
    pump(ep, r, 5);
    uint64_t now = bench_now_ns();
    if (now >= next_rss) {
      sample_rss(d, &out->rss_peak);
      next_rss = now + 50000000u;
    }
    bool all = true;
    for (int i = 0; i < nc; i++)
      all = all && (cs[i].turn_ended || cs[i].close_code);
    if (all || now > deadline)
      break;
  }
  out->wall = (double)(bench_now_ns() - start) / 1e9;
  out->cpu_daemon = cpu_d0 >= 0 ? 100 * (cpu_s(d->rss_pid) - cpu_d0) / out->wall : -1;
  out->cpu_client = 100 * (self_cpu_s() - cpu_c0) / out->wall;
  out->complete = true;
  for (int i = 0; i < nc; i++)
    out->complete = out->complete && cs[i].turn_ended;
  sample_rss(d, &out->rss_peak);

  /* Now read the slow client: what the kernel held, then the close frame once the daemon sees it drain
   * (it drops the connection 10 s after a close it could not send). */
  uint64_t sent = 0; /* bytes a fast client got: what the daemon tried to send the slow one */
  for (int i = 0; i < nc; i++)
    if (cs[i].bytes > sent)
      sent = cs[i].bytes;
  /* Bytes in the kernel between the daemon and the slow client: the daemon's send queue (from
   * /proc/net/tcp) and the slow client's receive queue. The daemon's queue overflows only past them. */
  int inq = 0;
  ioctl(slow.fd, FIONREAD, &inq);
  uint64_t kernel = server_send_q(d->port, slow.fd) + (uint64_t)(inq > 0 ? inq : 0);
  out->kernel_mib = (double)kernel / (1 << 20);
  out->slow_applies = sent > queue_bytes + kernel + 65536;
  out->sent_mib = (double)sent / (1 << 20);
  watch(ep, &slow);
  /* Until its close frame (or EOF), or until it stays quiet for a second: then it is still open. */
  uint64_t slow_deadline = bench_now_ns() + 15000000000u;
  while (!slow.close_code && bench_now_ns() < slow_deadline) {
    struct pollfd p = {.fd = slow.fd, .events = POLLIN};
    if (poll(&p, 1, 1000) == 0)
      break;
    client_read(ep, &slow, r);
  }
  out->slow_code = slow.close_code;
  out->slow_mib_read = (double)slow.bytes / (1 << 20);
  if (slow.fd >= 0) {
    if (slow.in_epoll)
      epoll_ctl(ep, EPOLL_CTL_DEL, slow.fd, NULL);
    close(slow.fd);
  }
  free(slow.buf);

  out->min_frames = UINT64_MAX;
  for (int i = 0; i < nc; i++) {
    if (cs[i].deltas < out->min_frames)
      out->min_frames = cs[i].deltas;
    if (cs[i].deltas > out->max_frames)
      out->max_frames = cs[i].deltas;
    if (cs[i].close_code)
      out->others_closed++;
  }
  uint64_t total = 0;
  for (int i = 0; i < nc; i++)
    total += cs[i].deltas;
  double span = r->last_ns > r->first_ns ? (double)(r->last_ns - r->first_ns) / 1e9 : 0;
  out->fps = span > 0 ? (double)total / span : 0;
  out->p50 = hist_q(&r->h, 0.50);
  out->p99 = hist_q(&r->h, 0.99);
  out->p999 = hist_q(&r->h, 0.999);
  out->max = (double)r->h.max_ns / 1e6;
  out->rss_end = rss_kib(d->rss_pid);
  uint64_t settle_end = bench_now_ns() + (uint64_t)(settle * 1e9);
  while (bench_now_ns() < settle_end)
    pump(ep, r, 50);
  out->rss_settled = rss_kib(d->rss_pid);
  return true;
}

/* ---- main -----------------------------------------------------------------------------------------------
 */

/* ---- abuse: idle connections, replay to sockets that never read (reliability findings 4 and 7) ----------
 */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* `n` host.describe calls one after another: p50 and max in ms (p99 of so few is the max). */
static bool api_latency(const daemon_ctl *d, int n, double *p50, double *max) {
  double *ms = calloc((size_t)n, sizeof *ms);
  if (!ms)
    return false;
  for (int i = 0; i < n; i++) {
    uint64_t t0 = bench_now_ns();
    json_t *v = api_call(d, "host.describe", json_object());
    ms[i] = (double)(bench_now_ns() - t0) / 1e6;
    if (!v) {
      free(ms);
      return false;
    }
    json_decref(v);
  }
  qsort(ms, (size_t)n, sizeof *ms, cmp_double);
  *p50 = ms[n / 2];
  *max = ms[n - 1];
  free(ms);
  return true;
}

/* A prompt of `mib` MiB (finding 12): the daemon's peak RSS against its RSS before, and the longest
 * host.describe another client waited for meanwhile. The prompt is sent by a child process; this one
 * samples and calls until the child has its answer and the turn has ended. */
static int run_big_prompt(const daemon_ctl *d, int mib) {
  json_t *created = api_call(d, "session.create", json_pack("{s:s, s:s}", "cwd", d->dir, "provider", "echo"));
  const char *sid_v = json_string_value(json_object_get(created, "sessionId"));
  if (!sid_v) {
    json_decref(created);
    return 1;
  }
  char sid[64];
  snprintf(sid, sizeof sid, "%s", sid_v);
  json_decref(created);
  usleep(300000);
  long before = rss_kib(d->rss_pid), peak = before;
  bool exact = bench_peak_reset(d->rss_pid);
  size_t n = (size_t)mib << 20;
  pid_t child = fork();
  if (child == 0) {
    char *text = malloc(n + 1);
    if (!text)
      _exit(1);
    memset(text, 'p', n);
    text[n] = '\0';
    json_t *v = api_call(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", text));
    _exit(v ? 0 : 1);
  }
  double worst = 0;
  int calls = 0, status = 0;
  uint64_t end = bench_now_ns() + 120000000000ull;
  bool sent = false, ended = false;
  while (bench_now_ns() < end && !(sent && ended)) {
    uint64_t t0 = bench_now_ns();
    json_t *v = api_call(d, "host.describe", json_object());
    double ms = (double)(bench_now_ns() - t0) / 1e6;
    json_decref(v);
    calls++;
    if (ms > worst)
      worst = ms;
    long r = rss_kib(d->rss_pid);
    if (r > peak)
      peak = r;
    if (!sent && waitpid(child, &status, WNOHANG) == child)
      sent = true;
    if (sent) {
      json_t *st = api_call(d, "session.get", json_pack("{s:s}", "sessionId", sid));
      ended = strcmp(json_string_value(json_object_get(json_object_get(st, "session"), "status")) ?: "",
                     "idle") == 0;
      json_decref(st);
    }
    usleep(20000);
  }
  if (!sent) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  if (exact && bench_status_kib(d->rss_pid, "VmHWM:") > peak)
    peak = bench_status_kib(d->rss_pid, "VmHWM:");
  double grew = (double)(peak - before) / 1024;
  printf("a %d MiB prompt (finding 12), POST session.prompt, the echo provider answering it\n", mib);
  printf("   daemon RSS before %7.1f MB, peak %7.1f MB (%s): +%.1f MB = %.2fx the body\n",
         (double)before / 1024, (double)peak / 1024, exact ? "the kernel's high-water mark" : "sampled", grew,
         grew / mib);
  printf("   longest host.describe of another client meanwhile: %.1f ms (%d calls)\n", worst, calls);
  printf("   the prompt %s; targets: peak <= 2x the body: %s, no call stalled >= 100 ms: %s\n",
         sent && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "was acknowledged" : "FAILED",
         bench_verdict(grew / mib <= 2), bench_verdict(worst < 100));
  return 0;
}

static int run_abuse(const daemon_ctl *d, int idle_n) {
  double b50 = 0, bmax = 0, i50 = 0, imax = 0;
  if (!api_latency(d, 50, &b50, &bmax))
    return 1;
  int *idle = calloc((size_t)idle_n, sizeof *idle);
  int opened = 0;
  while (idle && opened < idle_n && (idle[opened] = tc_connect(d->port, 0)) >= 0)
    opened++;
  usleep(300000);
  bool ok = api_latency(d, 50, &i50, &imax);
  for (int i = 0; i < opened; i++)
    close(idle[i]);
  free(idle);
  if (!ok)
    return 1;
  printf("idle connections (finding 4): host.describe, 50 calls each, one after another\n");
  printf("   no idle connection (baseline)   p50 %7.2f ms  max %7.2f ms\n", b50, bmax);
  printf("   %4d idle connections           p50 %7.2f ms  max %7.2f ms  (p50 %.2fx the baseline)\n", opened,
         i50, imax, i50 / b50);
  printf("   target: every call < 100 ms with 1000 idle connections open: %s\n\n",
         bench_verdict(opened >= idle_n && imax < 100));

  /* Replay: ~24 MB of history, 30 mux sockets with after=0 that never read. */
  json_t *created = api_call(d, "session.create", json_pack("{s:s, s:s}", "cwd", d->dir, "provider", "echo"));
  const char *sid = json_string_value(json_object_get(created, "sessionId"));
  if (!sid) {
    json_decref(created);
    return 1;
  }
  size_t n = 400 * 1024;
  char *text = malloc(n + 1);
  memset(text, 'r', n);
  text[n] = '\0';
  for (int i = 0; i < 30; i++)
    json_decref(api_call(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", text)));
  free(text);
  json_decref(created);
  int ended = 0;
  for (int tries = 0; tries < 600 && ended < 30; tries++) {
    usleep(50000);
    json_t *v = api_call(d, "session.events", json_pack("{s:i, s:i}", "after", 0, "limit", 1000));
    ended = 0;
    size_t k = 0;
    json_t *e = NULL;
    json_array_foreach(json_object_get(v, "events"), k, e) {
      ended += strcmp(json_string_value(json_object_get(e, "kind")), "turn/ended") == 0;
    }
    json_decref(v);
  }
  usleep(500000);
  long before = rss_kib(d->rss_pid), peak = before;
  bool exact = bench_peak_reset(d->rss_pid);
  int socks[30];
  int nsocks = 0;
  for (; nsocks < 30; nsocks++)
    if ((socks[nsocks] = open_mux_at(d, "/api/ws/mux?after=0", 4096)) < 0)
      break;
  for (int t = 0; t < 40; t++) {
    usleep(100000);
    long r = rss_kib(d->rss_pid);
    if (r > peak)
      peak = r;
  }
  if (exact && bench_status_kib(d->rss_pid, "VmHWM:") > peak)
    peak = bench_status_kib(d->rss_pid, "VmHWM:");
  for (int i = 0; i < nsocks; i++)
    close(socks[i]);
  printf("mux replay (finding 7): 30 turns of 400 KB (~24 MB of history), %d sockets on /api/ws/mux?after=0 "
         "that never read (4 KiB receive buffers), ws_queue_bytes 1 MiB\n",
         nsocks);
  printf("   daemon RSS before %6.1f MB, peak over 4 s %6.1f MB (%s): +%.1f MB (%.2f MB per socket)\n",
         (double)before / 1024, (double)peak / 1024, exact ? "the kernel's high-water mark" : "sampled",
         (double)(peak - before) / 1024, (double)(peak - before) / 1024 / (nsocks ? nsocks : 1));
  printf("   target: bounded like live frames (at most about the queue cap per socket): %s\n\n",
         bench_verdict(nsocks == 30 && (peak - before) / 1024 <= 30 * 2 + 16));
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_browser_fanout AGENTHOST BENCH_STREAM_SO BROWSER_SO [options]\n"
          "       bench_browser_fanout --url LAUNCH_URL [--pid PID] [--provider NAME] [options]\n"
          "options: --clients N  --rates R1,R2,...  --seconds S  --settle S  --queue-bytes B  "
          "--target-ms MS  --floor BROADCAST_BARE  --no-batch  --abuse IDLE_CONNECTIONS  --big-prompt MIB\n");
}

/* One server's runs: a session, NC clients, every rate in turn (a row printed each), then the clients closed
 * and the RSS over the settle time. */
typedef struct series {
  result *res;
  int nrates;
  long rss_idle, rss_base, rss_after;
  char curve[512];
} series;

static bool run_series(daemon_ctl *d, const char *label, int nc, const double *rates, int nrates, double secs,
                       double settle, size_t queue_bytes, bool queue_default, series *out) {
  bool ok = false;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  client *cs = calloc((size_t)nc, sizeof *cs);
  run r = {.h.b = calloc(HIST_BUCKETS, sizeof(uint32_t))};
  out->res = calloc((size_t)nrates, sizeof *out->res);
  out->nrates = nrates;
  json_t *created = NULL;
  int opened = 0;
  if (ep < 0 || !cs || !r.h.b || !out->res)
    goto out;

  char cwd[300];
  snprintf(cwd, sizeof cwd, "%s", d->dir[0] ? d->dir : "/tmp");
  created = api_call(d, "session.create", json_pack("{s:s, s:s}", "cwd", cwd, "provider", d->provider));
  r.session = json_string_value(json_object_get(created, "sessionId"));
  if (!r.session)
    goto out;
  usleep(200000);
  out->rss_idle = rss_kib(d->rss_pid); /* the baseline: the session exists, no client is connected */
  for (; opened < nc; opened++) {
    int fd = open_mux(d, 0);
    if (fd < 0 || !client_init(&cs[opened], fd, false) || !watch(ep, &cs[opened])) {
      fprintf(stderr, "browser fanout: cannot open WebSocket client %d\n", opened + 1);
      if (fd >= 0)
        close(fd);
      goto out;
    }
  }
  /* Let the upgrades settle (the session.event frames of the creation, if any), then take the baseline. */
  uint64_t until = bench_now_ns() + 500000000u;
  while (bench_now_ns() < until)
    pump(ep, &r, 50);
  out->rss_base = rss_kib(d->rss_pid);

  printf("%s: %d mux clients%s + 1 slow client (4 KiB receive buffer, read after the run) on one "
         "session; %g s per rate; ws queue %zu bytes%s\n",
         label, nc, batch ? " (?batch=1)" : " (one envelope per message)", secs, queue_bytes,
         queue_default ? " (the plugin's default)" : "");
  printf("  RSS idle (session created, no client) %ld KiB, with %d clients connected %ld KiB\n",
         out->rss_idle, nc, out->rss_base);
  printf("  %8s %9s %13s %8s %8s %8s %8s %11s %-13s %6s %11s %s\n", "rate/s", "expected", "min/max rcvd",
         "p50 ms", "p99 ms", "p99.9", "max ms", "frames/s", "slow client", "others", "CPU% d/cl",
         "RSS KiB before/peak/end/settled");
  for (int i = 0; i < nrates; i++) {
    result *o = &out->res[i];
    if (!run_rate(d, ep, cs, nc, &r, rates[i], secs, settle, queue_bytes, o))
      goto out;
    char slow[64];
    if (o->slow_code == 1013)
      snprintf(slow, sizeof slow, "closed 1013");
    else if (o->slow_code == 0)
      snprintf(slow, sizeof slow, "open%s", o->slow_applies ? " (!)" : " (n/a)");
    else
      snprintf(slow, sizeof slow, "closed %d", o->slow_code);
    printf("  %8.0f %9llu %6llu/%-6llu %8.2f %8.2f %8.2f %8.2f %11.0f %-13s %6d %5.0f/%-5.0f "
           "%ld/%ld/%ld/%ld%s\n",
           o->rate, (unsigned long long)o->expected, (unsigned long long)o->min_frames,
           (unsigned long long)o->max_frames, o->p50, o->p99, o->p999, o->max, o->fps, slow, o->others_closed,
           o->cpu_daemon, o->cpu_client, o->rss_before, o->rss_peak, o->rss_end, o->rss_settled,
           o->complete ? "" : "  (turn end not seen by all)");
    fflush(stdout);
  }
  /* Close every client, then the settle time, then the RSS against the baseline without clients. */
  for (int i = 0; i < opened; i++)
    if (cs[i].fd >= 0) {
      close(cs[i].fd);
      cs[i].fd = -1;
    }
  opened = 0;
  /* RSS every 0.5 s of the settle time, then the last one is the figure. */
  size_t cl = 0;
  out->rss_after = rss_kib(d->rss_pid);
  for (double t = 0.5; t <= settle + 1e-9 && cl < sizeof out->curve - 32; t += 0.5) {
    usleep(500000);
    out->rss_after = rss_kib(d->rss_pid);
    cl += (size_t)snprintf(out->curve + cl, sizeof out->curve - cl, "%s%.1fs:%ld", cl ? " " : "", t,
                           out->rss_after);
  }
  ok = true;

out:
  for (int i = 0; i < opened; i++)
    if (cs[i].fd >= 0)
      close(cs[i].fd);
  for (int i = 0; cs && i < nc; i++)
    free(cs[i].buf);
  free(cs);
  free(r.h.b);
  json_decref(created);
  if (ep >= 0)
    close(ep);
  return ok;
}

/* Start the floor (bench/browser_broadcast_bare.c) with the same per-socket queue. */
static int start_floor(daemon_ctl *d, const char *bin, size_t queue_bytes) {
  const char *tmp = getenv("TMPDIR");
  snprintf(d->dir, sizeof d->dir, "%s/ah-fanout-floor-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(d->dir)) {
    d->dir[0] = '\0';
    return 1;
  }
  d->provider = "bench";
  char q[32];
  snprintf(q, sizeof q, "%zu", queue_bytes);
  char *const argv[] = {(char *)bin, q, NULL};
  if (spawn_server(d, argv) == 0)
    return 0;
  fprintf(stderr, "browser fanout: the floor %s did not start\n", bin);
  return 1;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const char *pos[3] = {0};
  int npos = 0;
  const char *url = NULL, *rates_s = "1000,2500,5000,10000", *queue = NULL, *provider = "bench";
  const char *floor_bin = NULL;
  int nc = 100;
  pid_t given_pid = 0;
  double secs = 5, settle = 3, target_ms = 5;
  int abuse = 0, big_prompt = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--no-batch") == 0) {
      batch = false;
      continue;
    }
    if (strncmp(a, "--", 2) == 0 && !val) {
      usage();
      return 1;
    }
    if (strcmp(a, "--url") == 0)
      url = argv[++i];
    else if (strcmp(a, "--pid") == 0)
      given_pid = (pid_t)atoi(argv[++i]);
    else if (strcmp(a, "--provider") == 0)
      provider = argv[++i];
    else if (strcmp(a, "--clients") == 0)
      nc = atoi(argv[++i]);
    else if (strcmp(a, "--rates") == 0)
      rates_s = argv[++i];
    else if (strcmp(a, "--seconds") == 0)
      secs = atof(argv[++i]);
    else if (strcmp(a, "--settle") == 0)
      settle = atof(argv[++i]);
    else if (strcmp(a, "--queue-bytes") == 0)
      queue = argv[++i];
    else if (strcmp(a, "--target-ms") == 0)
      target_ms = atof(argv[++i]);
    else if (strcmp(a, "--abuse") == 0)
      abuse = atoi(argv[++i]);
    else if (strcmp(a, "--floor") == 0)
      floor_bin = argv[++i];
    else if (strcmp(a, "--big-prompt") == 0)
      big_prompt = atoi(argv[++i]);
    else if (a[0] == '-' || npos == 3) {
      usage();
      return 1;
    } else
      pos[npos++] = a;
  }
  if (nc < 1 || nc > 1000 || secs <= 0 || (!url && npos != 3)) {
    usage();
    return 1;
  }
  double rates[32];
  int nrates = 0;
  for (const char *p = rates_s; *p && nrates < 32;) {
    rates[nrates] = strtod(p, (char **)&p);
    if (rates[nrates] >= 1)
      nrates++;
    while (*p == ',' || *p == ' ')
      p++;
    if (*p && (*p < '0' || *p > '9'))
      break;
  }
  if (!nrates) {
    usage();
    return 1;
  }

  if (abuse > 0) { /* the daemon inherits the limit: room for the idle connections */
    struct rlimit rl = {(rlim_t)abuse + 512, (rlim_t)abuse + 512};
    setrlimit(RLIMIT_NOFILE, &rl);
    if (!queue)
      queue = "1048576";
  }
  daemon_ctl d = {.out_fd = -1, .provider = provider};
  if (url) {
    if (!parse_url(url, &d.port, d.token, sizeof d.token)) {
      fprintf(stderr, "browser fanout: --url must be the launch URL (http://HOST:PORT/#k=TOKEN)\n");
      return 1;
    }
    d.rss_pid = given_pid;
  } else {
    int rc = start_daemon(&d, pos[0], pos[1], pos[2], queue);
    if (rc) {
      stop_daemon(&d);
      return 77;
    }
  }
  if (abuse > 0 || big_prompt > 0) {
    int rc = abuse > 0 ? run_abuse(&d, abuse) : run_big_prompt(&d, big_prompt);
    stop_daemon(&d);
    return rc;
  }
  /* The queue the slow client must fill: the one configured here, else the plugin's default. */
  size_t queue_bytes = queue ? (size_t)strtoull(queue, NULL, 10) : (size_t)8 << 20;
  int exit_code = 1;
  series host = {0}, bare = {0};
  printf(
      "  emit→frame = CLOCK_MONOTONIC at the emit (the fixture's sink->delta; the floor's formatting of the "
      "envelope) to this client's read of the frame (same machine, one client thread)\n");
  if (!run_series(&d, "browser fanout", nc, rates, nrates, secs, settle, queue_bytes, !queue, &host))
    goto out;
  if (!url)
    stop_daemon(&d);
  if (floor_bin) {
    daemon_ctl f = {.out_fd = -1};
    if (start_floor(&f, floor_bin, queue_bytes) != 0 ||
        !run_series(&f, "floor (bare libwebsockets broadcast, bench/browser_broadcast_bare.c)", nc, rates,
                    nrates, secs, settle, queue_bytes, !queue, &bare)) {
      stop_daemon(&f);
      goto out;
    }
    stop_daemon(&f);
  }

  printf("browser fanout: RSS idle %ld KiB → clients connected %ld KiB → after the runs, clients closed and "
         "%g s settle: %ld KiB (%+.1f %% of idle, %+.1f %% of connected)\n",
         host.rss_idle, host.rss_base, settle, host.rss_after,
         host.rss_idle > 0 ? 100.0 * (double)(host.rss_after - host.rss_idle) / (double)host.rss_idle : 0.0,
         host.rss_base > 0 ? 100.0 * (double)(host.rss_after - host.rss_base) / (double)host.rss_base : 0.0);
  printf("  RSS KiB after closing the clients: %s\n", host.curve);
  if (floor_bin) {
    printf("against the floor (frames/s delivered to all clients together; at a rate both keep up with, both "
           "deliver rate × clients):\n");
    for (int i = 0; i < nrates; i++)
      printf("  %8.0f/s: host %11.0f, floor %11.0f frames/s = %.2f; p99 host %.2f ms, floor %.2f ms\n",
             rates[i], host.res[i].fps, bare.res[i].fps,
             bare.res[i].fps > 0 ? host.res[i].fps / bare.res[i].fps : 0.0, host.res[i].p99, bare.res[i].p99);
  }
  printf("verdicts (this machine, %ld online CPUs):\n", sysconf(_SC_NPROCESSORS_ONLN));
  for (int i = 0; i < nrates; i++) {
    result *o = &host.res[i];
    bool all = o->min_frames == o->expected && o->complete;
    bool lat = all && o->p99 <= target_ms;
    printf("  %6.0f/s: p99 emit→frame ≤ %g ms: %s (p99 %.2f ms%s); every client got every delta: %s "
           "(min %llu of %llu)",
           o->rate, target_ms, bench_verdict(lat), o->p99, all ? "" : ", frames missing", bench_verdict(all),
           (unsigned long long)o->min_frames, (unsigned long long)o->expected);
    if (floor_bin) {
      double ratio = bare.res[i].fps > 0 ? o->fps / bare.res[i].fps : 0;
      printf("; ≥ 70 %% of the floor's frames/s: %s (%.2f)", bench_verdict(all && ratio >= 0.70), ratio);
    }
    if (o->slow_applies)
      printf("; slow client closed 1013, others unaffected: %s",
             bench_verdict(o->slow_code == 1013 && !o->others_closed && all));
    else
      printf("; slow client: n/a (%.1f MiB sent ≤ queue %.1f MiB + %.1f MiB in the kernel), others "
             "unaffected: %s",
             o->sent_mib, (double)queue_bytes / (1 << 20), o->kernel_mib,
             bench_verdict(!o->others_closed && all));
    long base = o->rss_before;
    printf("; RSS back to within 10 %% of its start: %s (%ld → %ld KiB)\n",
           bench_verdict(base > 0 && o->rss_settled > 0 && o->rss_settled <= base + base / 10), base,
           o->rss_settled);
  }
  printf("  RSS back to the idle baseline (within 10 %%) once the clients are gone: %s (%ld → %ld KiB)\n",
         bench_verdict(host.rss_idle > 0 && host.rss_after > 0 &&
                       host.rss_after <= host.rss_idle + host.rss_idle / 10),
         host.rss_idle, host.rss_after);
  exit_code = 0;

out:
  free(host.res);
  free(bare.res);
  if (!url)
    stop_daemon(&d);
  return exit_code;
}
