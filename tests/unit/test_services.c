/* Host services a plugin uses for its own work — timers, posted tasks, pool work — and what withdraw does
 * with what a plugin leaves behind. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>

#include "host_support.h"
#include "internal.h"
#include "support.h"

static uv_loop_t loop;
static ah_host *host;
static const ah_host_api *api;
static ah_mount *core;

static void setup(void) {
  cr_assert_eq(uv_loop_init(&loop), 0);
  host = th_host_new(&loop, 500);
  cr_assert_not_null(host);
  api = ah__host_api(host);
  core = ah__host_core_mount(host);
}

static void teardown(void) {
  cr_assert_eq(th_host_stop_free(&loop, host), 0);
}

TestSuite(services, .init = setup, .fini = teardown, .timeout = 30);

static void count_fire(ah_timer *t, void *arg) {
  (void)t;
  (*(int *)arg)++;
}

static bool at_least_three(void *arg) {
  return *(int *)arg >= 3;
}

Test(services, one_shot_and_repeating_timers) {
  int once = 0;
  int rep = 0;
  ah_timer *t1 = NULL;
  ah_timer *t2 = NULL;
  cr_assert_eq(api->timer_start(core, 1, 0, count_fire, &once, &t1), 0);
  cr_assert_eq(api->timer_start(core, 1, 2, count_fire, &rep, &t2), 0);
  cr_assert(ts_run_until_pred(&loop, at_least_three, &rep, 2000));
  cr_assert_eq(once, 1, "a one-shot timer fires once (and is freed by the host)");
  api->timer_stop(t2);
  int seen = rep;
  uint64_t until = ts_now_ms() + 30;
  while (ts_now_ms() < until)
    uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(rep, seen, "a stopped timer does not fire again");
  cr_assert_eq(api->timer_start(core, 1, 0, NULL, NULL, NULL), AH_EINVAL);
}

static void stop_self(ah_timer *t, void *arg) {
  (*(int *)arg)++;
  api->timer_stop(t);
}

Test(services, timer_stopped_from_its_own_callback) {
  int n = 0;
  cr_assert_eq(api->timer_start(core, 1, 1, stop_self, &n, NULL), 0);
  uint64_t until = ts_now_ms() + 50;
  while (ts_now_ms() < until)
    uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(n, 1);
}

static void posted(void *arg) {
  (*(int *)arg)++;
}

Test(services, post_runs_on_a_later_loop_turn) {
  int n = 0;
  cr_assert_eq(api->post(core, posted, &n), 0);
  cr_assert_eq(n, 0, "never synchronously");
  uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(n, 1);
  cr_assert_eq(api->post(core, NULL, NULL), AH_EINVAL);
}

typedef struct work_ctx {
  pthread_t loop_thread;
  bool other_thread;
  bool after_on_loop;
  int status;
  bool done;
} work_ctx;

static void work_fn(void *arg) {
  work_ctx *w = arg;
  w->other_thread = !pthread_equal(pthread_self(), w->loop_thread);
}

static void after_fn(void *arg, int status) {
  work_ctx *w = arg;
  w->after_on_loop = pthread_equal(pthread_self(), w->loop_thread);
  w->status = status;
  w->done = true;
}

Test(services, queue_work_runs_on_the_pool_and_completes_on_the_loop) {
  work_ctx w = {.loop_thread = pthread_self(), .status = 1};
  cr_assert_eq(api->queue_work(core, work_fn, after_fn, &w), 0);
  cr_assert(ts_run_until(&loop, &w.done, 5000));
  cr_assert(w.other_thread);
  cr_assert(w.after_on_loop);
  cr_assert_eq(w.status, 0);
}

static void on_event(const char *name, const json_t *data, void *arg) {
  (void)name;
  (void)data;
  (*(int *)arg)++;
}

Test(services, withdraw_stops_what_a_plugin_left) {
  /* The ok fixture is unloaded while the test holds a subscription of the core: the ok mount's own
   * subscriptions, timers and posts are the host's to remove, and plugin.withdrawn still reaches the
   * core's subscriber. */
  int withdrawn = 0;
  cr_assert_eq(api->subscribe(core, "plugin.withdrawn", on_event, &withdrawn, NULL), 0);
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  ah_mount *ok = NULL;
  AH__LIST_EACH(it, &host->mounts) {
    ah_mount *m = AH__CONTAINER(it, ah_mount, link);
    if (strcmp(m->name, "ok") == 0)
      ok = m;
  }
  cr_assert_not_null(ok);
  /* Give the ok mount work it "forgets" to stop. (The API allows host services outside mount().) */
  int fired = 0;
  int delivered = 0;
  int ran = 0;
  cr_assert_eq(api->timer_start(ok, 5, 5, count_fire, &fired, NULL), 0);
  cr_assert_eq(api->subscribe(ok, "*", on_event, &delivered, NULL), 0);
  cr_assert_eq(api->post(ok, posted, &ran), 0);
  cr_assert_eq(th_unload(&loop, host, "ok"), 0);
  int fired_then = fired;
  int delivered_then = delivered;
  uint64_t until = ts_now_ms() + 50;
  while (ts_now_ms() < until)
    uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(fired, fired_then, "the host stopped the timer the plugin left");
  cr_assert_eq(delivered, delivered_then, "the plugin's subscription ended with its mount");
  cr_assert_eq(withdrawn, 1);
  cr_assert_eq(ah__host_zombie_count(host), 0, "timers the host made are not zombies");
}

Test(audit, privileged_calls_are_recorded_without_values, .timeout = 30) {
  uv_loop_t l;
  cr_assert_eq(uv_loop_init(&l), 0);
  char *dir = ts_mkdtemp();
  char state[600];
  snprintf(state, sizeof state, "%s/state", dir);
  ah_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.state_dir = state;
  ah_host *h = NULL;
  ah_host_opts opts = {.loop = &l, .config = &cfg, .mode = "serve", .drain_ms = 500};
  cr_assert_eq(ah__host_new(&opts, &h), 0);
  ts_outcome o;
  /* Refused (LAN), then allowed (admin) but failing on a path whose value must not be logged, then a
   * public method, which is not audited. */
  cr_assert_eq(th_call(&l, h, AH_AUTH_LAN, "plugin.unload", json_pack("{s:s}", "name", "x"), &o), AH_EPERM);
  cr_assert_eq(
      th_call(&l, h, AH_AUTH_ADMIN, "plugin.load", json_pack("{s:s}", "path", "/SECRET-VALUE.so"), &o), 0);
  cr_assert_neq(o.status, 0);
  th_outcome_clear(&o);
  cr_assert_eq(th_call(&l, h, AH_AUTH_LAN, "host.describe", NULL, &o), 0);
  th_outcome_clear(&o);
  cr_assert_eq(th_host_stop_free(&l, h), 0);

  char path[700];
  snprintf(path, sizeof path, "%s/audit.log", state);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char line[1024];
  int n = 0;
  json_t *recs[4] = {NULL};
  while (n < 4 && fgets(line, sizeof line, f))
    recs[n++] = json_loads(line, 0, NULL);
  fclose(f);
  cr_assert_eq(n, 2, "two privileged calls, one record each");
  cr_assert_str_eq(json_string_value(json_object_get(recs[0], "method")), "plugin.unload");
  cr_assert_str_eq(json_string_value(json_object_get(recs[0], "authority")), "lan");
  cr_assert_str_eq(json_string_value(json_object_get(recs[0], "outcome")), "EPERM");
  cr_assert_str_eq(json_string_value(json_object_get(recs[1], "method")), "plugin.load");
  cr_assert_str_eq(json_string_value(json_object_get(recs[1], "authority")), "admin");
  cr_assert_str_eq(json_string_value(json_object_get(recs[1], "outcome")), "ELOAD");
  cr_assert_not_null(json_object_get(recs[1], "time"));
  for (int i = 0; i < n; i++)
    json_decref(recs[i]);
  char *text = ts_read_file(path, NULL);
  cr_assert_null(strstr(text, "SECRET-VALUE"), "no parameter value in the audit log");
  free(text);
  ts_rmtree(dir);
  free(dir);
}
