/* The mount transaction and withdraw (ARCHITECTURE.md "Mount and withdraw").
 *
 * Withdraw is a small state machine driven by two host timers of the mount, so that every step starts on
 * a fresh loop turn and never inside the plugin's own callback:
 *   begin    registrations WITHDRAWN (new calls fail closed), subscriptions stopped
 *   TRIP     token tripped → callers answered `cancelled`; pool work not started is cancelled
 *   DRAIN    wait until no call or pool work of the mount is in flight, up to the deadline
 *   PLUGIN   the plugin's withdraw(state, done), up to the deadline
 *   REMOVE   host services left over stopped, registrations removed in reverse order, plugin.withdrawn
 *   UNMAP    when every host handle of the mount is closed: if no loop handle points into the module or a
 *            library only it brought in (and nothing timed out), dlclose(); else keep it mapped (zombie)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum {
  PHASE_NONE = 0,
  PHASE_TRIP,
  PHASE_DRAIN,
  PHASE_PLUGIN,
  PHASE_REMOVE,
  PHASE_UNMAP,
  PHASE_DONE,
};

static void phase_run(uv_timer_t *t);

static void schedule(ah_mount *m, int phase) {
  m->phase = phase;
  uv_timer_start(&m->phase_timer, phase_run, 0, 0);
}

static void released(ah_mount *m, int kind);

static ah_mount *mount_new(ah_host *h) {
  ah_mount *m = calloc(1, sizeof *m);
  if (!m)
    return NULL;
  m->host = h;
  m->on_release = released;
  ah__list_init(&m->journal);
  ah__list_init(&m->calls);
  ah__list_init(&m->subs);
  ah__list_init(&m->timers);
  ah__list_init(&m->https);
  ah__list_init(&m->works);
  ah__list_init(&m->procs);
  ah__list_init(&m->tokens);
  ah__list_init(&m->posts);
  ah__list_init(&m->records);
  ah__list_init(&m->waiters);
  ah__list_init(&m->link);
  m->token = ah__cancel_new(h->token);
  uv_timer_init(h->loop, &m->phase_timer);
  uv_timer_init(h->loop, &m->deadline_timer);
  m->phase_timer.data = m;
  m->deadline_timer.data = m;
  if (!m->token) {
    free(m);
    return NULL;
  }
  return m;
}

void ah__mount_free(ah_mount *m) {
  ah__records_close_all(m);
  /* The mount's two timers must be closed already (UNMAP closes them). */
  ah__cancel_free(m->token);
  json_decref(m->config);
  free(m->ranges);
  free(m->name);
  free(m->version);
  free(m->description);
  free(m->path);
  free(m);
}

/* ---- load ------------------------------------------------------------------------------------------ */

int ah__mount_core(ah_host *h, ah_mount **out, int (*reg)(ah_host *h, ah_mount *m)) {
  ah_mount *m = mount_new(h);
  if (!m)
    return AH_ENOMEM;
  m->name = strdup("core");
  m->version = strdup(AH_VERSION);
  m->description = strdup("the host core");
  m->config = json_object();
  m->state = AH__MOUNT_MOUNTING;
  int rc = reg(h, m);
  if (rc == 0 && m->registration_failed)
    rc = AH_EINTERNAL;
  if (rc) {
    ah__registry_remove(&h->reg, m, false);
    return rc; /* the host is unusable; the caller tears the loop down */
  }
  ah__registry_publish(&h->reg, m);
  m->state = AH__MOUNT_ACTIVE;
  m->published = true;
  ah__list_push(&h->mounts, &m->link);
  *out = m;
  return 0;
}

static void why_set(char **why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why_set(char **why, const char *fmt, ...) {
  if (!why)
    return;
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(why, fmt, ap) < 0)
    *why = NULL;
  va_end(ap);
}

static int start_withdraw(ah_mount *m, bool call_plugin, ah__done_fn cb, void *arg);

int ah__host_load(ah_host *h, const char *path, const json_t *config, char **name, char **why) {
  if (why)
    *why = NULL;
  if (name)
    *name = NULL;
  if (!h || !path)
    return AH_EINVAL;
  if (h->stopping) {
    why_set(why, "the host is stopping");
    return AH_ESTATE;
  }
  if (config && !json_is_object(config)) {
    why_set(why, "%s: field config: must be an object", path);
    return AH_EINVAL;
  }
  json_t *before = ah__loaded_objects();
  void *dl = NULL;
  const ah_plugin_desc *d = NULL;
  int rc = ah__plugin_open(path, &dl, &d, why);
  if (rc) {
    json_decref(before);
    return rc;
  }
  ah_mount *other = ah__host_find_mount(h, d->name);
  if (other) {
    AH_LOG_E("plugins", "refused %s: field name: plugin '%s' is already mounted (from %s)", path, d->name,
             other->path ? other->path : "core");
    why_set(why, "%s: field name: plugin '%s' is already mounted", path, d->name);
    json_decref(before);
    dlclose(dl);
    return AH_EEXIST;
  }
  ah_mount *m = mount_new(h);
  if (!m) {
    json_decref(before);
    dlclose(dl);
    return AH_ENOMEM;
  }
  m->dl = dl;
  m->name = strdup(d->name);
  m->version = ah__strdup(d->version ? d->version : "");
  m->description = ah__strdup(d->description ? d->description : "");
  m->path = realpath(path, NULL);
  if (!m->path)
    m->path = strdup(path);
  m->config = config ? json_deep_copy(config) : json_object();
  m->mount_fn = d->mount;
  m->withdraw_fn = d->withdraw;
  m->may_withdraw_fn = AH_HAS_FIELD(d, ah_plugin_desc, may_withdraw) ? d->may_withdraw : NULL;
  rc = ah__mount_record_ranges(m, before);
  json_decref(before);
  if (rc || !m->name || !m->version || !m->description || !m->path || !m->config) {
    m->state = AH__MOUNT_WITHDRAWING;
    ah__list_push(&h->dying, &m->link);
    start_withdraw(m, false, NULL, NULL);
    return AH_ENOMEM;
  }
  m->state = AH__MOUNT_MOUNTING;
  void *state = NULL;
  rc = m->mount_fn(m, &ah__api_table, m->config, &state);
  m->state_ptr = state;
  if (rc == 0 && !m->registration_failed) {
    ah__registry_publish(&h->reg, m);
    m->state = AH__MOUNT_ACTIVE;
    m->published = true;
    ah__list_push(&h->mounts, &m->link);
    AH_LOG_I("plugins", "mounted %s %s from %s", m->name, m->version, m->path);
    ah__host_emit(h, "plugin.mounted",
                  json_pack("{s:s, s:s, s:s}", "name", m->name, "version", m->version, "path", m->path));
    if (name)
      *name = strdup(m->name);
    return 0;
  }
  bool plugin_ok = rc == 0;
  if (plugin_ok) {
    rc = AH_EINVAL;
    AH_LOG_E("plugins",
             "refused %s (%s): field registrations: a registration failed inside mount() "
             "(the plugin returned success)",
             m->name, m->path);
    why_set(why, "%s: field registrations: a registration failed inside mount()", path);
  } else {
    AH_LOG_E("plugins", "refused %s (%s): field mount: mount() failed: %s (%s)", m->name, m->path,
             ah_err_name(rc), ah_strerror(rc));
    why_set(why, "%s: field mount: mount() failed: %s", path, ah_strerror(rc));
  }
  /* Nothing became visible: the staged entries are dropped (no tombstones), then whatever the plugin
   * started is stopped and the module unloaded on later loop turns. */
  ah__registry_remove(&h->reg, m, false);
  m->state = AH__MOUNT_WITHDRAWING;
  ah__list_push(&h->dying, &m->link);
  start_withdraw(m, plugin_ok, NULL, NULL);
  return rc;
}

/* ---- withdraw -------------------------------------------------------------------------------------- */

static void deadline_fired(uv_timer_t *t) {
  ah_mount *m = t->data;
  if (m->phase == PHASE_DRAIN) {
    m->drain_timed_out = true;
    AH_LOG_W("plugins", "withdraw %s: %zu call(s) and %zu pool work item(s) still in flight after %llu ms",
             m->name, m->ncalls, m->nworks, (unsigned long long)m->host->drain_ms);
    schedule(m, PHASE_PLUGIN);
  } else if (m->phase == PHASE_PLUGIN) {
    AH_LOG_W("plugins", "withdraw %s: the plugin did not report done within %llu ms", m->name,
             (unsigned long long)m->host->drain_ms);
    schedule(m, PHASE_REMOVE);
  }
}

/* A call, pool work or closing handle of `m` was released (holds.c): the withdraw goes on when it waited
 * for it. */
static void released(ah_mount *m, int kind) {
  if (kind == AH__HOLD_CLOSE) {
    if (m->closing == 0 && m->phase == PHASE_UNMAP)
      schedule(m, PHASE_UNMAP);
  } else if (m->state == AH__MOUNT_WITHDRAWING && m->phase == PHASE_DRAIN && m->ncalls == 0 &&
             m->nworks == 0) {
    schedule(m, PHASE_PLUGIN);
  }
}

static void plugin_done(ah_mount *m) {
  if (!m || m->done_called)
    return;
  m->done_called = true;
  /* The plugin has released its state: nothing of the host may call into it from now on (a timer, a
   * posted task or a delivery would reach freed state), so stop what it left at once. */
  ah__services_withdraw(m);
  if (m->phase == PHASE_PLUGIN)
    schedule(m, PHASE_REMOVE); /* never continue inside the plugin's callback */
}

typedef struct walk_ctx {
  const ah_mount *m;
  int hits;
  char first[64];
} walk_ctx;

#define FN_ADDR(f) ((const void *)(uintptr_t)(f))

static bool handle_points_in(const ah_mount *m, uv_handle_t *h) {
  if (ah__mount_in_module(m, h) || ah__mount_in_module(m, FN_ADDR(h->close_cb)))
    return true;
  const void *cbs[3] = {NULL, NULL, NULL};
  switch (h->type) {
  case UV_TIMER:
    cbs[0] = FN_ADDR(((uv_timer_t *)h)->timer_cb);
    break;
  case UV_IDLE:
    cbs[0] = FN_ADDR(((uv_idle_t *)h)->idle_cb);
    break;
  case UV_PREPARE:
    cbs[0] = FN_ADDR(((uv_prepare_t *)h)->prepare_cb);
    break;
  case UV_CHECK:
    cbs[0] = FN_ADDR(((uv_check_t *)h)->check_cb);
    break;
  case UV_ASYNC:
    cbs[0] = FN_ADDR(((uv_async_t *)h)->async_cb);
    break;
  case UV_POLL:
    cbs[0] = FN_ADDR(((uv_poll_t *)h)->poll_cb);
    break;
  case UV_SIGNAL:
    cbs[0] = FN_ADDR(((uv_signal_t *)h)->signal_cb);
    break;
  case UV_PROCESS:
    cbs[0] = FN_ADDR(((uv_process_t *)h)->exit_cb);
    break;
  case UV_TCP:
  case UV_NAMED_PIPE:
  case UV_TTY:
    cbs[0] = FN_ADDR(((uv_stream_t *)h)->read_cb);
    cbs[1] = FN_ADDR(((uv_stream_t *)h)->alloc_cb);
    cbs[2] = FN_ADDR(((uv_stream_t *)h)->connection_cb);
    break;
  case UV_UDP:
    cbs[0] = FN_ADDR(((uv_udp_t *)h)->recv_cb);
    cbs[1] = FN_ADDR(((uv_udp_t *)h)->alloc_cb);
    break;
  case UV_FS_EVENT:
    cbs[0] = FN_ADDR(((uv_fs_event_t *)h)->cb);
    break;
  default:
    break;
  }
  for (int i = 0; i < 3; i++)
    if (ah__mount_in_module(m, cbs[i]))
      return true;
  return false;
}

static void walk_cb(uv_handle_t *h, void *arg) {
  walk_ctx *ctx = arg;
  if (handle_points_in(ctx->m, h)) {
    if (ctx->hits++ == 0)
      snprintf(ctx->first, sizeof ctx->first, "%s handle %p", uv_handle_type_name(h->type), (void *)h);
  }
}

static void mount_timer_closed(uv_handle_t *h) {
  ah_mount *m = h->data;
  if (--m->closing > 0)
    return;
  ah_host *host = m->host;
  /* A zombie is listed before its waiters hear of the end of the withdraw, so they can see it. */
  bool zombie = m->state == AH__MOUNT_ZOMBIE;
  if (zombie)
    ah__list_push(&host->zombies, &m->link);
  while (!ah__list_empty(&m->waiters)) {
    ah__waiter *w = AH__CONTAINER(m->waiters.next, ah__waiter, link);
    ah__list_remove(&w->link);
    if (w->cb)
      w->cb(0, w->arg);
    free(w);
  }
  if (!zombie)
    ah__mount_free(m);
}

static bool inside_module(const void *addr, void *arg) {
  return ah__mount_in_module(arg, addr);
}

static void unmap(ah_mount *m) {
  ah_host *h = m->host;
  walk_ctx ctx = {.m = m, .hits = 0, .first = ""};
  if (m->dl) {
    uv_walk(h->loop, walk_cb, &ctx);
    size_t peers = ah__rpc_peers_referencing(inside_module, m);
    if (peers > 0 && ctx.hits++ == 0)
      snprintf(ctx.first, sizeof ctx.first, "a JSON-RPC peer left open");
    ctx.hits += (int)(peers > 0 ? peers - 1 : 0);
  }
  bool zombie = m->drain_timed_out || !m->done_called;
  if (ctx.hits > 0) {
    AH_LOG_W("plugins",
             "plugin %s (%s) kept mapped as a zombie: %d loop handle(s) still point into it or a library "
             "it brought in (first: %s)",
             m->name, m->path ? m->path : "core", ctx.hits, ctx.first);
    zombie = true;
  } else if (zombie) {
    AH_LOG_W("plugins", "plugin %s (%s) kept mapped as a zombie: %s", m->name, m->path ? m->path : "core",
             m->drain_timed_out ? "calls were still in flight at the deadline"
                                : "it never reported withdraw done");
  }
  if (m->dl && !zombie) {
    if (h->keep_mapped) {
      AH_LOG_D("plugins", "plugin %s left mapped (AH_KEEP_PLUGINS_MAPPED)", m->name);
    } else if (dlclose(m->dl) != 0) {
      AH_LOG_W("plugins", "dlclose %s failed", m->path);
    }
    m->dl = NULL;
  }
  m->state = zombie ? AH__MOUNT_ZOMBIE : AH__MOUNT_GONE;
  m->phase = PHASE_DONE;
  m->closing = 2;
  uv_close((uv_handle_t *)&m->phase_timer, mount_timer_closed);
  uv_close((uv_handle_t *)&m->deadline_timer, mount_timer_closed);
}

static void phase_run(uv_timer_t *t) {
  ah_mount *m = t->data;
  ah_host *h = m->host;
  switch (m->phase) {
  case PHASE_TRIP:
    ah__cancel_trip(m->token);
    ah__calls_cancel_mount(m);
    ah__services_cancel_work(m);
    m->phase = PHASE_DRAIN;
    uv_timer_start(&m->deadline_timer, deadline_fired, h->drain_ms, 0);
    if (m->ncalls == 0 && m->nworks == 0)
      schedule(m, PHASE_PLUGIN);
    break;
  case PHASE_DRAIN:
    break;
  case PHASE_PLUGIN:
    uv_timer_stop(&m->deadline_timer);
    if (m->withdraw_fn && m->call_withdraw) {
      m->phase = PHASE_PLUGIN;
      uv_timer_start(&m->deadline_timer, deadline_fired, h->drain_ms, 0);
      m->withdraw_fn(m, m->state_ptr, plugin_done);
    } else {
      m->done_called = true;
      schedule(m, PHASE_REMOVE);
    }
    break;
  case PHASE_REMOVE:
    uv_timer_stop(&m->deadline_timer);
    if (m->done_called)
      ah__services_withdraw(m);
    else
      ah__services_quiesce(m); /* it still owns them: a late done frees them (plugin_done) */
    bool was_published = m->published;
    ah__registry_remove(&h->reg, m, true);
    ah__list_remove(&m->link);
    if (was_published) {
      AH_LOG_I("plugins", "withdrew %s", m->name);
      ah__host_emit(h, "plugin.withdrawn", json_pack("{s:s}", "name", m->name));
    }
    m->phase = PHASE_UNMAP;
    if (m->closing == 0)
      schedule(m, PHASE_UNMAP);
    break;
  case PHASE_UNMAP:
    if (m->closing == 0)
      unmap(m);
    break;
  default:
    break;
  }
}

static int start_withdraw(ah_mount *m, bool call_plugin, ah__done_fn cb, void *arg) {
  if (cb) {
    ah__waiter *w = calloc(1, sizeof *w);
    if (!w)
      return AH_ENOMEM;
    w->cb = cb;
    w->arg = arg;
    ah__list_push(&m->waiters, &w->link);
  }
  m->call_withdraw = call_plugin;
  ah__registry_withdraw(&m->host->reg, m);
  /* Turns on the plugin's providers end now, while its code is certainly mapped. */
  if (m->host->on_withdraw)
    m->host->on_withdraw(m->host->on_withdraw_arg, m);
  AH__LIST_EACH(it, &m->subs) {
    AH__CONTAINER(it, ah_sub, mount_link)->active = false;
  }
  schedule(m, PHASE_TRIP);
  return 0;
}

int ah__mount_begin_withdraw(ah_mount *m, ah__done_fn cb, void *arg) {
  if (m->state == AH__MOUNT_WITHDRAWING) {
    /* Already going: wait with the others. */
    ah__waiter *w = calloc(1, sizeof *w);
    if (!w)
      return AH_ENOMEM;
    w->cb = cb;
    w->arg = arg;
    ah__list_push(&m->waiters, &w->link);
    return 0;
  }
  if (m->state != AH__MOUNT_ACTIVE)
    return AH_ESTATE;
  m->state = AH__MOUNT_WITHDRAWING;
  return start_withdraw(m, true, cb, arg);
}
