/* agenthost — the host core's internal API (used by main.c, the admin channel and the tests).
 *
 * One process = one ah_host on one libuv loop; every function here runs on the loop thread.
 */
#ifndef AGENTHOST_HOST_HOST_H
#define AGENTHOST_HOST_HOST_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "agenthost/plugin.h"
#include "config.h"

typedef struct ah_host ah_host;

/* Completion of an asynchronous host operation: 0 or a negative AH_E* code. */
typedef void (*ah__done_fn)(int status, void *arg);

typedef struct ah_host_opts {
  uv_loop_t *loop;         /* required, borrowed for the host's lifetime */
  const ah_config *config; /* borrowed for the host's lifetime; NULL = defaults (tests) */
  const char *mode;        /* "serve", "sdk" or "acp"; NULL = "serve" */
  uint64_t drain_ms;       /* withdraw's drain deadline; 0 = 2000 */
  bool recover_sessions;   /* resume sessions left running or with queued prompts at start */
  /* Called (on the loop) when a plugin asks the host to stop (api->host_stop); NULL = refused. */
  void (*on_stop_request)(int exit_code, void *arg);
  void *stop_request_arg;
} ah_host_opts;

/* Create the host and mount the core (its methods: host.describe, plugin.list, plugin.load,
 * plugin.unload, plugin.reload; its eleven allowlisted events). With a configuration that has a
 * state_dir, also the durable store and the sessions (session.*, request.*; sessions.h). Returns 0,
 * AH_EINVAL, AH_ENOMEM, or the store's error (corrupt database, newer schema: logged with the reason). */
int ah__host_new(const ah_host_opts *opts, ah_host **out);

/* Load and mount the plugin module at `path`, with `config` (borrowed; NULL = {}). Synchronous.
 * Returns 0, or AH_ELOAD (dlopen or symbol failure), AH_EABI (NULL descriptor, other major, newer minor,
 * bad struct_size), AH_EINVAL (missing mount, bad name), AH_EEXIST (plugin name already mounted),
 * AH_ESTATE (host stopping) or the plugin's mount() failure (also when a registration failed). Every
 * refusal is logged with the path, the field and the reason; *why (may be NULL) receives a malloc'ed
 * one-line reason. *name (may be NULL) receives the malloc'ed plugin name on success. */
int ah__host_load(ah_host *h, const char *path, const json_t *config, char **name, char **why);

/* Withdraw the plugin `name` (ARCHITECTURE.md "Mount and withdraw"), starting on a fresh loop turn.
 * Returns AH_ENOENT, AH_EBUSY (vetoed by may_withdraw, or a withdraw already running) without calling
 * `cb`; else 0 and `cb` (may be NULL) runs once the mount is removed (and unloaded or kept as a zombie). */
int ah__host_unload(ah_host *h, const char *name, ah__done_fn cb, void *arg);

/* Withdraw `name`, then load the same path again with the same config. `cb` gets the load's result. */
int ah__host_reload(ah_host *h, const char *name, ah__done_fn cb, void *arg);

/* Dispatch a method call (see ah_host_api.dispatch). */
int ah__host_dispatch(ah_host *h, const ah_caller *caller, const char *method, json_t *params,
                      ah_cancel *parent, ah_reply_fn cb, void *arg);

/* host.describe's value: {name, version, protocol, abi {major, minor}, plugins: [{name, version,
 * description, path, methods: [{name, privileged, cancellable}], events: [{name, allowlisted}],
 * descriptors: [...]}]}. New reference. */
json_t *ah__host_describe(ah_host *h); /* a new reference to a shared value: do not modify it */

/* plugin.list's value: [{name, version, path, state}] including zombies. New reference. */
json_t *ah__host_plugin_list(ah_host *h);

/* Emit a core event (the core mount's events). `data` stolen. */
int ah__host_emit(ah_host *h, const char *name, json_t *data);

/* The API table handed to plugins, and the core's own mount (for host-internal registrations). */
const ah_host_api *ah__host_api(ah_host *h);
ah_mount *ah__host_core_mount(ah_host *h);
uv_loop_t *ah__host_loop(ah_host *h);
const ah_config *ah__host_config(ah_host *h);
/* The recorder of a surface's connections (record.h), opened on first use; NULL when recording is off or
 * does not include `surface`, or the recording cannot be written (logged once). */
struct ah_recorder *ah__host_recorder(ah_host *h, const char *surface);
const char *ah__host_run_id(const ah_host *h);
struct ah_sessions *ah__host_sessions(ah_host *h); /* NULL without a state directory */

/* Mount every plugin the config enables for the host's mode; a missing module of a plugin enabled only
 * by default is a warning, of one enabled explicitly an error (logged; the host goes on). In the sdk and
 * acp modes the plugin of that name is mounted first whatever the config says; when that fails, returns
 * its error (the process has nothing to serve). */
int ah__host_mount_configured(ah_host *h);

/* Apply a new configuration (SIGHUP): withdraw mounted plugins no longer enabled, mount newly enabled
 * ones, remount those whose config changed; emit host.config-changed. `cfg` is borrowed for the host's
 * lifetime from then on (the caller keeps the old one alive until `cb`). */
int ah__host_apply_config(ah_host *h, const ah_config *cfg, ah__done_fn cb, void *arg);

/* Stop: refuse new dispatch and loads, withdraw every plugin in reverse mount order, withdraw the core,
 * then `cb`. After `cb`, ah__host_free() and the loop can be closed. */
int ah__host_stop(ah_host *h, ah__done_fn cb, void *arg);
bool ah__host_stopping(ah_host *h);

/* Free the host after ah__host_stop() completed (or when no plugin was ever mounted). Closes the handles
 * of zombie modules' leftovers that still sit on the loop only when the module is kept mapped. */
void ah__host_free(ah_host *h);

/* Counters for tests and benchmarks. */
size_t ah__host_zombie_count(ah_host *h);
size_t ah__host_inflight(ah_host *h);

/* stubs.c (`agenthost remote stubs`): TypeScript declarations for `descriptors` (remote.describe's list);
 * malloc'ed, NULL when out of memory. */
char *ah__remote_stubs_ts(const json_t *descriptors);

#endif
