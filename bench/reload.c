/* Benchmark: 1000 load/unload cycles of the `ok` fixture while calls are dispatched continuously.
 *
 * Prints the time per reload cycle (target ≤ 5 ms), the fd count and RSS before, during and after (they
 * must stay flat), the calls answered during the run, and a baseline measured in the same invocation:
 * the same number of bare dlopen()/dlclose() cycles of the same module without the host, so the ratio
 * shows what the mount transaction and the withdraw protocol cost on top of the dynamic loader.
 * Exits non-zero on a crash-free but wrong run (a call answered with an unexpected error, fds growing).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e = NULL;
  while (d && (e = readdir(d)))
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n - 1;
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0)
      kib = strtol(line + 6, NULL, 10);
  if (f)
    fclose(f);
  return kib;
}

typedef struct counters {
  uint64_t ok;
  uint64_t unavailable;
  uint64_t cancelled;
  uint64_t other;
  uint64_t in_flight;
} counters;

static counters calls;
static ah_host *host;

static void on_reply(const ah_outcome *o, void *arg) {
  (void)arg;
  calls.in_flight--;
  if (o->status == 0)
    calls.ok++;
  else if (o->status == AH_ECANCELED)
    calls.cancelled++;
  else
    calls.other++;
}

/* Each loop iteration dispatches one call, whatever the state of the plugin. */
static void dispatch_tick(uv_idle_t *idle) {
  (void)idle;
  ah_caller caller = {.struct_size = sizeof caller, .authority = AH_AUTH_LAN, .surface = "bench"};
  int rc = ah__host_dispatch(host, &caller, "ok.echo", json_pack("{s:i}", "n", 1), NULL, on_reply, NULL);
  if (rc == 0)
    calls.in_flight++;
  else if (rc == AH_EUNAVAILABLE || rc == AH_ENOMETHOD)
    calls.unavailable++;
  else
    calls.other++;
}

static void unloaded(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

static void stopped(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH-TO-ok.so [cycles]\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  int cycles = argc > 2 ? atoi(argv[2]) : 1000;
  ah__log_set_level(AH_LOG_WARN);

  /* Baseline: bare dlopen/dlclose of the same module. */
  uint64_t b0 = now_ns();
  for (int i = 0; i < cycles; i++) {
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 1;
    }
    dlclose(dl);
  }
  double base_ms = (double)(now_ns() - b0) / 1e6 / cycles;

  uv_loop_t loop;
  uv_loop_init(&loop);
  ah_host_opts opts = {.loop = &loop, .config = NULL, .mode = "serve", .drain_ms = 2000};
  if (ah__host_new(&opts, &host) != 0)
    return 1;
  uv_idle_t idle;
  uv_idle_init(&loop, &idle);
  uv_idle_start(&idle, dispatch_tick);

  /* Warm up once so that first-load costs (relocations of libraries) are not counted as growth. */
  int fds0 = 0;
  long rss0 = 0;
  long rss_mid = 0;
  uint64_t t0 = 0;
  double worst_ms = 0;
  for (int i = -1; i < cycles; i++) {
    if (i == 0) {
      fds0 = count_fds();
      rss0 = rss_kib();
      t0 = now_ns();
    }
    if (i == cycles / 2)
      rss_mid = rss_kib();
    uint64_t c0 = now_ns();
    char *why = NULL;
    if (ah__host_load(host, path, NULL, NULL, &why) != 0) {
      fprintf(stderr, "load failed at cycle %d: %s\n", i, why ? why : "?");
      return 1;
    }
    /* Let a few calls reach the mounted plugin. */
    for (int k = 0; k < 3; k++)
      uv_run(&loop, UV_RUN_NOWAIT);
    bool done = false;
    if (ah__host_unload(host, "ok", unloaded, &done) != 0)
      return 1;
    while (!done)
      uv_run(&loop, UV_RUN_ONCE);
    double ms = (double)(now_ns() - c0) / 1e6;
    if (i >= 0 && ms > worst_ms)
      worst_ms = ms;
  }
  double per_ms = (double)(now_ns() - t0) / 1e6 / cycles;
  int fds1 = count_fds();
  long rss1 = rss_kib();

  uv_idle_stop(&idle);
  uv_close((uv_handle_t *)&idle, NULL);
  bool done = false;
  ah__host_stop(host, stopped, &done);
  while (!done)
    uv_run(&loop, UV_RUN_ONCE);
  ah__host_free(host);
  uv_run(&loop, UV_RUN_DEFAULT);
  int close_rc = uv_loop_close(&loop);

  printf("reload cycles:            %d\n", cycles);
  printf("time per reload cycle:    %.3f ms (worst %.3f ms; target <= 5 ms)\n", per_ms, worst_ms);
  printf("baseline dlopen+dlclose:  %.3f ms per cycle\n", base_ms);
  printf("ratio cycle / baseline:   %.1fx\n", base_ms > 0 ? per_ms / base_ms : 0.0);
  printf("open fds:                 %d before, %d after (delta %d)\n", fds0, fds1, fds1 - fds0);
  printf("RSS:                      %ld KiB before, %ld KiB mid-run, %ld KiB after (delta %ld KiB)\n", rss0,
         rss_mid, rss1, rss1 - rss0);
  printf("calls during the run:     %llu ok, %llu cancelled, %llu refused unavailable, %llu other\n",
         (unsigned long long)calls.ok, (unsigned long long)calls.cancelled,
         (unsigned long long)calls.unavailable, (unsigned long long)calls.other);
  printf("uv_loop_close:            %d\n", close_rc);
  int bad = close_rc != 0 || fds1 != fds0 || calls.other != 0 || calls.ok == 0 || calls.in_flight != 0;
  printf("%s\n", bad ? "RESULT: FAIL" : "RESULT: OK");
  return bad;
}
