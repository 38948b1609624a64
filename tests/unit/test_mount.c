/* Mount transaction: every refusal of a module and of a registration, rollback of a failed mount, and
 * fail-closed names (PROTOCOLS.md "Core": plugin load, registration, fail closed). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host_support.h"
#include "internal.h"
#include "support.h"

static uv_loop_t loop;
static ah_host *host;
static int log_pipe[2];

static void setup(void) {
  cr_assert_eq(uv_loop_init(&loop), 0);
  host = th_host_new(&loop, 500);
  cr_assert_not_null(host);
  cr_assert_eq(pipe(log_pipe), 0);
  ah__log_set_fd(log_pipe[1]);
}

static void teardown(void) {
  ah__log_set_fd(-1);
  close(log_pipe[1]);
  close(log_pipe[0]);
  cr_assert_eq(th_host_stop_free(&loop, host), 0, "the loop must close cleanly");
}

/* What the host logged so far (non-blocking read of the pipe). */
static char *logged(void) {
  static char buf[65536];
  size_t n = 0;
  ah__log_set_fd(-1);
  close(log_pipe[1]);
  ssize_t r = 0;
  while ((r = read(log_pipe[0], buf + n, sizeof buf - 1 - n)) > 0)
    n += (size_t)r;
  buf[n] = '\0';
  close(log_pipe[0]);
  cr_assert_eq(pipe(log_pipe), 0);
  ah__log_set_fd(log_pipe[1]);
  return buf;
}

static int load_why(const char *fixture, json_t *config, char **why) {
  int rc = ah__host_load(host, ts_plugin(fixture), config, NULL, why);
  json_decref(config);
  return rc;
}

TestSuite(mount, .init = setup, .fini = teardown, .timeout = 60);

Test(mount, ok_mounts_and_is_described) {
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  cr_assert(th_described(host, "methods", "ok.echo"));
  cr_assert(th_described(host, "events", "ok.ping"));
  cr_assert(th_described(host, "descriptors", "ok.greet"));
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "ok.add", json_pack("{s:i,s:i}", "a", 2, "b", 40), &o), 0);
  cr_assert(o.done);
  cr_assert_eq(o.status, 0);
  cr_assert_eq(json_integer_value(json_object_get(o.result, "sum")), 42);
  th_outcome_clear(&o);
}

Test(mount, refuses_other_major) {
  char *why = NULL;
  cr_assert_eq(load_why("bad-abi", NULL, &why), AH_EABI);
  cr_assert_not_null(strstr(why, "field abi"), "%s", why);
  cr_assert_not_null(strstr(why, "major"), "%s", why);
  free(why);
  const char *log = logged();
  cr_assert_not_null(strstr(log, "bad-abi.so"), "the refusal names the plugin path: %s", log);
  cr_assert_not_null(strstr(log, "field abi"), "%s", log);
}

Test(mount, refuses_newer_minor) {
  char *why = NULL;
  cr_assert_eq(load_why("newer-minor", NULL, &why), AH_EABI);
  cr_assert_not_null(strstr(why, "newer than the host"), "%s", why);
  /* Both versions are named: the module's and the host's. */
  char mine[32], hosts[32];
  snprintf(mine, sizeof mine, "ABI %d.%d", AH_ABI_MAJOR, AH_ABI_MINOR + 1);
  snprintf(hosts, sizeof hosts, "%d.%d", AH_ABI_MAJOR, AH_ABI_MINOR);
  cr_expect_not_null(strstr(why, mine), "%s", why);
  cr_expect_not_null(strstr(why, hosts), "%s", why);
  free(why);
  cr_assert_not_null(strstr(logged(), "newer-minor.so"));
}

Test(mount, refuses_null_descriptor) {
  char *why = NULL;
  cr_assert_eq(load_why("null-desc", NULL, &why), AH_EABI);
  cr_assert_not_null(strstr(why, "field descriptor"), "%s", why);
  free(why);
  cr_assert_not_null(strstr(logged(), "null-desc.so"));
}

Test(mount, refuses_missing_entry) {
  char *why = NULL;
  cr_assert_eq(load_why("no-entry", NULL, &why), AH_ELOAD);
  cr_assert_not_null(strstr(why, "ah_plugin_entry_v1"), "%s", why);
  free(why);
  cr_assert_not_null(strstr(logged(), "no-entry.so"));
}

Test(mount, refuses_missing_mount) {
  char *why = NULL;
  cr_assert_eq(load_why("no-mount", NULL, &why), AH_EINVAL);
  cr_assert_not_null(strstr(why, "field mount"), "%s", why);
  free(why);
  cr_assert_not_null(strstr(logged(), "no-mount.so"));
}

Test(mount, refuses_missing_file) {
  char *why = NULL;
  cr_assert_eq(ah__host_load(host, "/nonexistent/plugin.so", NULL, NULL, &why), AH_ELOAD);
  cr_assert_not_null(strstr(why, "dlopen"), "%s", why);
  free(why);
}

Test(mount, refuses_duplicate_plugin_name) {
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  char *why = NULL;
  cr_assert_eq(load_why("dup-name", NULL, &why), AH_EEXIST);
  cr_assert_not_null(strstr(why, "field name"), "%s", why);
  free(why);
  cr_assert_not_null(strstr(logged(), "dup-name.so"));
  /* The first one is untouched. */
  cr_assert(th_described(host, "methods", "ok.echo"));
}

Test(mount, refuses_method_registered_by_another_plugin) {
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  cr_assert_eq(th_load(host, "duplicate-method", NULL), AH_EEXIST);
  json_t *list = ah__host_plugin_list(host);
  char *text = json_dumps(list, 0);
  cr_assert_null(strstr(text, "duplicate-method\""), "%s", text);
  free(text);
  json_decref(list);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "ok.echo", json_pack("{s:i}", "x", 1), &o), 0);
  cr_assert_eq(o.status, 0, "ok.echo still belongs to ok");
  th_outcome_clear(&o);
}

Test(mount, registration_failure_fails_mount_even_if_ignored) {
  /* duplicate-method in "self" mode registers dup.one twice, ignores AH_EEXIST and returns 0. */
  cr_assert_eq(th_load(host, "duplicate-method", json_pack("{s:s}", "mode", "self")), AH_EINVAL);
  cr_assert_not(th_described(host, "methods", "dup.one"));
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_ADMIN, "dup.one", NULL, &o), AH_ENOMETHOD);
  const char *log = logged();
  cr_assert_not_null(strstr(log, "dup.one"), "%s", log);
}

Test(mount, refuses_bad_method_name_and_missing_visibility) {
  cr_assert_eq(th_load(host, "bad-method-name", NULL), AH_EINVAL);
  cr_assert_not_null(strstr(logged(), "NoDots"));
  cr_assert_eq(th_load(host, "no-visibility", NULL), AH_EINVAL);
  cr_assert_not_null(strstr(logged(), "PUBLIC or PRIVILEGED"));
}

Test(mount, fails_midway_leaves_nothing_and_ok_still_mounts) {
  cr_assert_eq(th_load(host, "fails-midway", NULL), AH_EIO);
  cr_assert_not(th_described(host, "methods", "midway.method"));
  cr_assert_not(th_described(host, "events", "midway.event"));
  cr_assert_not(th_described(host, "descriptors", "midway.thing"));
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_ADMIN, "midway.method", NULL, &o), AH_ENOMETHOD,
               "a never-published name is unknown, not withdrawn");
  /* Its names are free again: nothing was left staged. */
  cr_assert_null(ah__registry_find(&host->reg, AH__ENTRY_METHOD, "midway.method"));
  cr_assert_null(ah__registry_find(&host->reg, AH__ENTRY_EVENT, "midway.event"));
  cr_assert_null(ah__registry_find(&host->reg, AH__ENTRY_REMOTE, "midway.thing"));
  cr_assert_null(ah__registry_find(&host->reg, AH__ENTRY_NAMESPACE, "midway"));
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  cr_assert(th_described(host, "methods", "ok.echo"));
  /* The failed module is unloaded on later loop turns without disturbing anything. */
  uv_run(&loop, UV_RUN_NOWAIT);
  cr_assert_eq(ah__host_zombie_count(host), 0);
  const char *log = logged();
  cr_assert_not_null(strstr(log, "fails-midway.so"), "%s", log);
}

Test(mount, registering_outside_mount_is_refused) {
  cr_assert_eq(th_load(host, "late-register", NULL), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "late.trigger", NULL, &o), 0);
  cr_assert_eq(o.status, 0);
  cr_assert_eq(json_integer_value(json_object_get(o.result, "status")), AH_ESTATE);
  th_outcome_clear(&o);
  cr_assert_not(th_described(host, "methods", "late.other"));
}

Test(mount, unload_then_call_fails_closed_until_remounted) {
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  cr_assert_eq(th_unload(&loop, host, "ok"), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "ok.echo", NULL, &o), AH_EUNAVAILABLE);
  cr_assert(ah__registry_tombstoned(&host->reg, AH__ENTRY_REMOTE, "ok.greet"));
  cr_assert_not(th_described(host, "methods", "ok.echo"));
  /* A remount of the same module starts fresh and serves the name again. */
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "ok.echo", json_pack("{s:s}", "v", "x"), &o), 0);
  cr_assert_eq(o.status, 0);
  cr_assert_str_eq(json_string_value(json_object_get(o.result, "v")), "x");
  th_outcome_clear(&o);
}

Test(mount, withdrawn_name_never_falls_back) {
  /* ok.echo withdrawn, then duplicate-method (which registers ok.echo) mounts: the name is served by
   * the new mount only because it registered it, and unloading that one fails closed again. */
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  cr_assert_eq(th_unload(&loop, host, "ok"), 0);
  cr_assert_eq(th_load(host, "duplicate-method", NULL), 0);
  cr_assert(th_described(host, "methods", "ok.echo"));
  cr_assert_eq(th_unload(&loop, host, "duplicate-method"), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "ok.echo", NULL, &o), AH_EUNAVAILABLE);
}

Test(mount, may_withdraw_veto) {
  cr_assert_eq(th_load(host, "veto", NULL), 0);
  cr_assert_eq(ah__host_unload(host, "veto", NULL, NULL), AH_EBUSY);
  json_t *list = ah__host_plugin_list(host);
  char *text = json_dumps(list, 0);
  cr_assert_not_null(strstr(text, "\"veto\""), "%s", text);
  free(text);
  json_decref(list);
  cr_assert_eq(th_unload(&loop, host, "core"), AH_EPERM);
  cr_assert_eq(th_unload(&loop, host, "nope"), AH_ENOENT);
}

static void reload_done(int status, void *arg) {
  int *out = arg;
  *out = status;
}

static bool reload_finished(void *arg) {
  return *(int *)arg != 1;
}

Test(mount, reload_remounts_the_same_path) {
  cr_assert_eq(th_load(host, "ok", NULL), 0);
  int status = 1;
  cr_assert_eq(ah__host_reload(host, "ok", reload_done, &status), 0);
  cr_assert(ts_run_until_pred(&loop, reload_finished, &status, 5000));
  cr_assert_eq(status, 0);
  cr_assert(th_described(host, "methods", "ok.echo"));
  cr_assert_eq(ah__host_reload(host, "nope", reload_done, &status), AH_ENOENT);
}

Test(mount, core_methods_and_events_described) {
  json_t *d = ah__host_describe(host);
  cr_assert_str_eq(json_string_value(json_object_get(d, "version")), AH_VERSION);
  cr_assert_eq(json_integer_value(json_object_get(d, "protocol")), AH_PROTOCOL_VERSION);
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(d, "abi"), "major")), AH_ABI_MAJOR);
  json_decref(d);
  const char *events[] = {"session.created",  "session.closed",    "session.status",     "session.event",
                          "subagent.started", "subagent.finished", "request.pending",    "request.resolved",
                          "plugin.mounted",   "plugin.withdrawn",  "host.config-changed"};
  for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
    cr_assert(th_described(host, "events", events[i]), "%s", events[i]);
  cr_assert(th_described(host, "methods", "plugin.load"));
}

/* Core "plugin load" (the ABI minor check) and the growth rule: a module built against the frozen ABI 1.0
 * headers (tests/abi/1.0) mounts in today's host, and what it registered runs — a method, and a remote
 * descriptor whose params have the 1.0 layout and whose definition ends before `data` and `param_size`. */
Test(mount, a_module_built_for_abi_1_0_mounts_and_runs) {
  cr_assert_eq(th_load(host, "abi-1-0", NULL), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "abi10.add", json_pack("{s:i,s:i}", "a", 40, "b", 2), &o),
               0);
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  cr_expect_eq(json_integer_value(json_object_get(o.result, "sum")), 42);
  cr_expect_eq(json_integer_value(json_object_get(o.result, "hostMinor")), AH_ABI_MINOR);
  cr_expect(json_is_true(json_object_get(o.result, "tableAtLeast10")));
  th_outcome_clear(&o);
  const ah_caller lan = {.struct_size = sizeof(ah_caller), .authority = AH_AUTH_LAN, .surface = "test"};
  memset(&o, 0, sizeof o);
  json_t *args = json_pack("{s:i, s:i}", "a", 6, "b", 7);
  cr_assert_eq(ah__remote_invoke(host, &lan, "abi10", "mul", args, NULL, th_reply, &o), 0);
  json_decref(args);
  cr_assert(ts_run_until(&loop, &o.done, 10000), "no outcome");
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  cr_expect_eq(json_integer_value(o.result), 42);
  th_outcome_clear(&o);
}

/* Core "plugin load", the growth rule: a module built against the frozen 1.2 headers (the minor before
 * today's), whose descriptor ends before `commands`, mounts and runs its method. */
Test(mount, a_module_built_for_abi_1_2_mounts_and_runs) {
  cr_assert_eq(th_load(host, "abi-1-2", NULL), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "abi12.ping", json_object(), &o), 0);
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  cr_expect_eq(json_integer_value(json_object_get(o.result, "minor")), 2);
  cr_expect(json_is_true(json_object_get(o.result, "hasStdioRpc")));
  th_outcome_clear(&o);
}

/* The same for the minor before today's (1.3, before the HTTP client): the commands fixture built against
 * the frozen 1.3 headers mounts and unloads (test_cli runs its command). */
Test(mount, a_module_built_for_abi_1_3_mounts) {
  cr_assert_eq(th_load(host, "abi-1-3", NULL), 0);
  cr_expect_eq(th_unload(&loop, host, "commands"), 0, "its module is named commands");
}

/* And for 1.4 (before register_tool). */
Test(mount, a_module_built_for_abi_1_4_mounts) {
  cr_assert_eq(th_load(host, "abi-1-4", NULL), 0);
  cr_expect_eq(th_unload(&loop, host, "commands"), 0, "its module is named commands");
}

/* Core "plugin load" and the growth rule: a plugin that needs entries the host lacks sees them absent and
 * refuses to mount, naming the entry, instead of calling NULL. The remote plugin against two older tables: an
 * earlier 1.1 host (same table size, remote_invoke not filled in yet) and a 1.0 host (the table ends before
 * the 1.1 entries). */
static char probe_log[512];
static void probe_logf(ah_mount *m, int level, const char *fmt, ...) {
  (void)m;
  (void)level;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(probe_log, sizeof probe_log, fmt, ap);
  va_end(ap);
}

static int mount_remote_on(const ah_host_api *table) {
  char *path = NULL;
  cr_assert(asprintf(&path, "%s/plugins/remote/remote.so", getenv("AH_TEST_BUILD_ROOT")) > 0);
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  free(path);
  if (!so)
    cr_skip_test("the remote plugin is not built here");
  ah_plugin_entry_fn entry = (ah_plugin_entry_fn)dlsym(so, AH_PLUGIN_ENTRY_SYMBOL);
  cr_assert_not_null(entry);
  const ah_plugin_desc *d = entry(table->abi);
  cr_assert_not_null(d);
  void *state = NULL;
  probe_log[0] = '\0';
  json_t *cfg = json_object();
  int rc = d->mount(NULL, table, cfg, &state);
  json_decref(cfg);
  cr_expect_null(state);
  dlclose(so);
  return rc;
}

Test(mount, a_plugin_sees_entries_the_host_lacks_as_absent) {
  ah_host_api early = ah__api_table;
  early.log = probe_logf;
  early.remote_invoke = NULL;
  cr_expect_eq(mount_remote_on(&early), AH_EABI);
  cr_expect_not_null(strstr(probe_log, "remote_invoke"), "%s", probe_log);
  ah_host_api v10 = ah__api_table;
  v10.log = probe_logf;
  v10.abi = AH_ABI_MAKE(1, 0);
  v10.struct_size = (uint32_t)offsetof(ah_host_api, register_provider);
  cr_expect_eq(mount_remote_on(&v10), AH_EABI);
  cr_expect_not_null(strstr(probe_log, "remote_describe"), "%s", probe_log);
}
