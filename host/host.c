/* The host: one loop, the core mount, the mounted plugins in order, the pump that delivers outcomes,
 * posted tasks and bus events on later loop turns, and the start/stop order. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"
#include "http.h"
#include "internal.h"
#include "record.h"
#include "sessions.h"

int ah__mount_core(ah_host *h, ah_mount **out, int (*reg)(ah_host *h, ah_mount *m));
int ah__core_register(ah_host *h, ah_mount *m);

/* The pump's drains, in order: call outcomes, posted tasks, bus events. */
static const ah__drain drains[] = {
    {.run = ah__calls_drain, .pending = ah__calls_pending},
    {.run = ah__services_drain_posts, .pending = ah__services_posts_pending},
    {.run = ah__bus_deliver, .pending = ah__bus_pending},
};

/* A mount starts its withdraw: the turns on its providers end while its code is mapped. */
static void sessions_on_withdraw(void *arg, ah_mount *m) {
  ah__sessions_provider_withdrawn(arg, m);
}

int ah__host_new(const ah_host_opts *opts, ah_host **out) {
  if (!opts || !opts->loop || !out)
    return AH_EINVAL;
  ah_host *h = calloc(1, sizeof *h);
  if (!h)
    return AH_ENOMEM;
  h->loop = opts->loop;
  h->config = opts->config;
  h->mode = strdup(opts->mode ? opts->mode : "serve");
  h->drain_ms = opts->drain_ms ? opts->drain_ms : 2000;
  ah__uuid7(h->run_id);
  const char *keep = getenv("AH_KEEP_PLUGINS_MAPPED");
  h->keep_mapped = keep && strcmp(keep, "1") == 0;
  h->on_stop_request = opts->on_stop_request;
  h->stop_request_arg = opts->stop_request_arg;
  ah__list_init(&h->mounts);
  ah__list_init(&h->zombies);
  ah__list_init(&h->dying);
  ah__list_init(&h->subs);
  ah__list_init(&h->completions);
  ah__list_init(&h->posts);
  ah__api_table.rpc = ah_rpc_api_get();
  h->token = ah__cancel_new(NULL);
  if (!h->mode || !h->token || ah__registry_init(&h->reg) != 0) {
    ah__registry_free(&h->reg);
    ah__cancel_free(h->token);
    free(h->mode);
    free(h);
    return AH_ENOMEM;
  }
  h->audit_fd = -1;
  if (h->config && h->config->state_dir)
    ah__audit_open(h);
  ah__pump_init(&h->pump, h->loop, drains, sizeof drains / sizeof drains[0], h);
  int rc = 0;
  if (h->config && h->config->state_dir) {
    char *why = NULL;
    /* A stdio child opens the store at its first session call: it answers `initialize` without it. */
    ah_sessions_opts so = {.host = h,
                           .config = h->config,
                           .lease_ttl_ms = h->config->lease_ttl_ms,
                           .recover = opts->recover_sessions,
                           .lazy_store = strcmp(h->mode, "serve") != 0};
    rc = ah__sessions_new(&so, &h->sessions, &why);
    if (rc) {
      AH_LOG_E("host", "cannot open the store: %s", why ? why : ah_strerror(rc));
      free(why);
      h->sessions = NULL;
      h->stopping = true;
      *out = h;
      return rc;
    }
    h->on_withdraw = sessions_on_withdraw;
    h->on_withdraw_arg = h->sessions;
  }
  rc = ah__mount_core(h, &h->core, ah__core_register);
  if (rc == 0 && h->sessions)
    ah__sessions_start(h->sessions, h->core);
  if (rc) {
    AH_LOG_E("host", "cannot mount the core: %s", ah_strerror(rc));
    /* The caller must still run the loop to close the pump; mark for ah__host_free. */
    h->stopping = true;
  }
  *out = h;
  return rc;
}

ah_mount *ah__host_find_mount(ah_host *h, const char *name) {
  AH__LIST_EACH(it, &h->mounts) {
    ah_mount *m = AH__CONTAINER(it, ah_mount, link);
    if (strcmp(m->name, name) == 0)
      return m;
  }
  return NULL;
}

int ah__host_emit(ah_host *h, const char *name, json_t *data) {
  if (!h->core) {
    json_decref(data);
    return AH_ESTATE;
  }
  return ah__bus_emit(h, h->core, name, data);
}

const ah_host_api *ah__host_api(ah_host *h) {
  (void)h;
  return &ah__api_table;
}
ah_mount *ah__host_core_mount(ah_host *h) {
  return h->core;
}
uv_loop_t *ah__host_loop(ah_host *h) {
  return h->loop;
}
const ah_config *ah__host_config(ah_host *h) {
  return h->config;
}
ah_sessions *ah__host_sessions(ah_host *h) {
  return h->sessions;
}
bool ah__host_stopping(ah_host *h) {
  return h->stopping;
}
size_t ah__host_inflight(ah_host *h) {
  return h->inflight;
}
size_t ah__host_zombie_count(ah_host *h) {
  size_t n = 0;
  AH__LIST_EACH(it, &h->zombies) {
    n++;
  }
  return n;
}

/* ---- describe ---------------------------------------------------------------------------------------- */

json_t *ah__describe_remote(const ah__entry *e) {
  const ah__remote *r = e->remote;
  json_t *params = json_array();
  for (size_t i = 0; i < r->nparams; i++)
    json_array_append_new(params,
                          json_pack("{s:s, s:s, s:b}", "name", r->params[i].name, "type",
                                    ah__type_name(r->params[i].type), "optional", r->params[i].optional));
  const char *lookup = r->lookup == AH_LOOKUP_SESSION ? "session"
                       : r->lookup == AH_LOOKUP_AGENT ? "agent"
                                                      : "none";
  return json_pack("{s:s, s:s, s:o, s:s, s:b, s:b, s:s, s:b}", "namespace", r->ns, "method", r->method,
                   "params", params, "result", ah__type_name(r->result), "resultOptional", r->result_optional,
                   "cancellable", (r->flags & AH_REMOTE_CANCELLABLE) != 0, "lookup", lookup, "privileged",
                   (r->flags & AH_REMOTE_PRIVILEGED) != 0);
}

static json_t *describe_mount(const ah_mount *m) {
  json_t *methods = json_array();
  json_t *events = json_array();
  json_t *descriptors = json_array();
  json_t *providers = json_array();
  AH__LIST_EACH(it, &m->journal) {
    const ah__entry *e = AH__CONTAINER(it, ah__entry, journal);
    if (e->state != AH__ST_ACTIVE)
      continue;
    if (e->kind == AH__ENTRY_METHOD)
      json_array_append_new(methods, json_pack("{s:s, s:b, s:b}", "name", e->name, "privileged",
                                               (e->flags & AH_METHOD_PRIVILEGED) != 0, "cancellable",
                                               (e->flags & AH_METHOD_CANCELLABLE) != 0));
    else if (e->kind == AH__ENTRY_EVENT)
      json_array_append_new(events, json_pack("{s:s, s:b}", "name", e->name, "allowlisted",
                                              (e->flags & AH_EVENT_ALLOWLISTED) != 0));
    else if (e->kind == AH__ENTRY_REMOTE)
      json_array_append_new(descriptors, ah__describe_remote(e));
    else if (e->kind == AH__ENTRY_PROVIDER)
      json_array_append_new(providers, json_string(e->name));
  }
  return json_pack("{s:s, s:s, s:s, s:s?, s:o, s:o, s:o, s:o}", "name", m->name, "version", m->version,
                   "description", m->description, "path", m->path, "methods", methods, "events", events,
                   "descriptors", descriptors, "providers", providers);
}

json_t *ah__host_describe(ah_host *h) {
  /* Built once per change of what is mounted or of the store's health: it is asked for often (every
   * client's handshake) and costs a few hundred JSON nodes. Callers get a reference and must not modify
   * it. */
  int store_state = h->sessions ? ah__sessions_store_state(h->sessions) : -1;
  if (h->describe_cache && h->describe_gen == h->reg.gen && h->describe_store == store_state)
    return json_incref(h->describe_cache);
  json_t *store = store_state >= 0 ? ah__sessions_store_health(h->sessions) : NULL;
  json_t *plugins = json_array();
  AH__LIST_EACH(it, &h->mounts) {
    const ah_mount *m = AH__CONTAINER(it, ah_mount, link);
    if (m->state == AH__MOUNT_ACTIVE)
      json_array_append_new(plugins, describe_mount(m));
  }
  json_t *d = json_pack("{s:s, s:s, s:i, s:{s:i, s:i}, s:s, s:s, s:o}", "name", "agenthost", "version",
                        AH_VERSION, "protocol", AH_PROTOCOL_VERSION, "abi", "major", AH_ABI_MAJOR, "minor",
                        AH_ABI_MINOR, "mode", h->mode, "runId", h->run_id, "plugins", plugins);
  if (store)
    json_object_set_new(d, "store", store);
  json_object_set_new(d, "hooks", ah__hooks_describe(h));
  json_decref(h->describe_cache);
  h->describe_cache = json_incref(d);
  h->describe_gen = h->reg.gen;
  h->describe_store = store_state;
  return d;
}

static const char *state_name(ah__mount_state s) {
  switch (s) {
  case AH__MOUNT_MOUNTING:
    return "mounting";
  case AH__MOUNT_ACTIVE:
    return "active";
  case AH__MOUNT_WITHDRAWING:
    return "withdrawing";
  case AH__MOUNT_GONE:
    return "gone";
  case AH__MOUNT_ZOMBIE:
    return "zombie";
  default:
    return "invalid";
  }
}

json_t *ah__host_plugin_list(ah_host *h) {
  json_t *list = json_array();
  ah__link *heads[2] = {&h->mounts, &h->zombies};
  for (int i = 0; i < 2; i++) {
    AH__LIST_EACH(it, heads[i]) {
      const ah_mount *m = AH__CONTAINER(it, ah_mount, link);
      json_array_append_new(list, json_pack("{s:s, s:s, s:s?, s:s, s:b}", "name", m->name, "version",
                                            m->version, "path", m->path, "state", state_name(m->state),
                                            "fromConfig", m->from_config));
    }
  }
  return list;
}

/* ---- unload / reload ------------------------------------------------------------------------------------
 */

int ah__host_unload(ah_host *h, const char *name, ah__done_fn cb, void *arg) {
  if (!h || !name)
    return AH_EINVAL;
  ah_mount *m = ah__host_find_mount(h, name);
  if (!m || m == h->core)
    return m ? AH_EPERM : AH_ENOENT;
  if (m->state == AH__MOUNT_WITHDRAWING)
    return AH_EBUSY;
  if (m->may_withdraw_fn) {
    int veto = m->may_withdraw_fn(m->state_ptr);
    if (veto) {
      AH_LOG_W("plugins", "plugin %s vetoed its withdraw: %s", m->name,
               ah_strerror(veto < 0 ? veto : AH_EBUSY));
      return veto < 0 ? veto : AH_EBUSY;
    }
  }
  return ah__mount_begin_withdraw(m, cb, arg);
}

typedef struct reload_ctx {
  ah_host *h;
  char *path;
  json_t *config;
  bool from_config;
  ah__done_fn cb;
  void *arg;
} reload_ctx;

static void reload_withdrawn(int status, void *arg) {
  reload_ctx *r = arg;
  int rc = status;
  if (rc == 0) {
    char *why = NULL;
    char *name = NULL;
    rc = ah__host_load(r->h, r->path, r->config, &name, &why);
    if (rc == 0) {
      ah_mount *m = ah__host_find_mount(r->h, name);
      if (m)
        m->from_config = r->from_config;
    }
    free(name);
    free(why);
  }
  if (r->cb)
    r->cb(rc, r->arg);
  free(r->path);
  json_decref(r->config);
  free(r);
}

int ah__host_reload(ah_host *h, const char *name, ah__done_fn cb, void *arg) {
  ah_mount *m = h && name ? ah__host_find_mount(h, name) : NULL;
  if (!m)
    return AH_ENOENT;
  reload_ctx *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  r->h = h;
  r->path = ah__strdup(m->path);
  r->config = json_incref(m->config);
  r->from_config = m->from_config;
  r->cb = cb;
  r->arg = arg;
  int rc = ah__host_unload(h, name, reload_withdrawn, r);
  if (rc) {
    free(r->path);
    json_decref(r->config);
    free(r);
  }
  return rc;
}

/* ---- configuration ------------------------------------------------------------------------------------ */

static int mount_one(ah_host *h, const char *name, const json_t *pc, bool required) {
  char *path = ah__config_module_path(h->config, name, pc);
  if (!path)
    return AH_ENOMEM;
  if (access(path, F_OK) != 0) {
    if (required)
      AH_LOG_E("host", "plugin %s is required but its module %s does not exist", name, path);
    else
      AH_LOG_W("host", "plugin %s is enabled but not installed (%s); going on without it", name, path);
    free(path);
    return AH_ENOENT;
  }
  char *why = NULL;
  char *loaded = NULL;
  int rc = ah__host_load(h, path, pc, &loaded, &why);
  if (rc == 0 && strcmp(loaded, name) != 0) {
    /* The config manages plugins by name: a module that calls itself something else would be loaded
     * again at every SIGHUP. */
    AH_LOG_E("host", "refused %s: field name: the module calls itself '%s' but is configured as [plugin.%s]",
             path, loaded, name);
    ah__mount_begin_withdraw(ah__host_find_mount(h, loaded), NULL,
                             NULL); /* no veto: it never should have been */
    rc = AH_EINVAL;
  } else if (rc == 0) {
    ah__host_find_mount(h, name)->from_config = true;
  }
  free(loaded);
  free(why);
  free(path);
  return rc;
}

int ah__host_mount_configured(ah_host *h) {
  if (!h->config)
    return 0;
  int rc = 0;
  if (strcmp(h->mode, "serve") != 0) {
    /* A stdio mode serves its own surface whatever the config says; without it there is nothing to do. */
    rc = mount_one(h, h->mode, json_object_get(h->config->plugins, h->mode), true);
    if (rc) {
      AH_LOG_E("host", "cannot serve %s: its plugin could not be mounted (%s)", h->mode, ah_strerror(rc));
      return rc;
    }
  }
  json_t *names = ah__config_plugins_for_mode(h->config, h->mode);
  size_t i = 0;
  json_t *n = NULL;
  json_array_foreach(names, i, n) {
    const char *name = json_string_value(n);
    if (!ah__host_find_mount(h, name))
      mount_one(h, name, json_object_get(h->config->plugins, name), false);
  }
  json_decref(names);
  return 0;
}

typedef struct apply_ctx {
  ah_host *h;
  json_t *todo; /* [["unload"|"reload"|"load", name], ...] */
  ah__done_fn cb;
  void *arg;
  int first_error;
} apply_ctx;

static void apply_step(int status, void *arg);

static void apply_next(apply_ctx *a) {
  while (json_array_size(a->todo) > 0) {
    json_t *step = json_incref(json_array_get(a->todo, 0));
    json_array_remove(a->todo, 0);
    const char *op = json_string_value(json_array_get(step, 0));
    const char *name = json_string_value(json_array_get(step, 1));
    int rc = 0;
    if (strcmp(op, "unload") == 0) {
      rc = ah__host_unload(a->h, name, apply_step, a);
    } else if (strcmp(op, "reload") == 0) {
      /* The config changed: withdraw, then mount with the new config. */
      json_array_insert_new(a->todo, 0, json_pack("[ss]", "load", name));
      rc = ah__host_unload(a->h, name, apply_step, a);
    } else {
      rc = mount_one(a->h, name, json_object_get(a->h->config->plugins, name), false);
      if (rc == AH_ENOENT)
        rc = 0;
      if (rc && !a->first_error)
        a->first_error = rc;
      rc = 1; /* synchronous: go on with the loop */
    }
    json_decref(step);
    if (rc == 0)
      return; /* continues in apply_step */
    if (rc < 0 && !a->first_error)
      a->first_error = rc;
  }
  ah__host_emit(a->h, "host.config-changed", json_pack("{s:s?}", "file", a->h->config->file));
  if (a->cb)
    a->cb(a->first_error, a->arg);
  json_decref(a->todo);
  free(a);
}

static void apply_step(int status, void *arg) {
  apply_ctx *a = arg;
  if (status && !a->first_error)
    a->first_error = status;
  apply_next(a);
}

int ah__host_apply_config(ah_host *h, const ah_config *cfg, ah__done_fn cb, void *arg) {
  if (!h || !cfg)
    return AH_EINVAL;
  if (h->stopping)
    return AH_ESTATE;
  apply_ctx *a = calloc(1, sizeof *a);
  if (!a)
    return AH_ENOMEM;
  a->h = h;
  a->todo = json_array();
  a->cb = cb;
  a->arg = arg;
  json_t *want = ah__config_plugins_for_mode(cfg, h->mode);
  /* Withdraw in reverse mount order what is no longer wanted or changed. */
  for (ah__link *it = h->mounts.prev; it != &h->mounts; it = it->prev) {
    ah_mount *m = AH__CONTAINER(it, ah_mount, link);
    if (!m->from_config)
      continue;
    bool wanted = false;
    size_t i = 0;
    json_t *n = NULL;
    json_array_foreach(want, i, n) {
      if (strcmp(json_string_value(n), m->name) == 0)
        wanted = true;
    }
    if (!wanted)
      json_array_append_new(a->todo, json_pack("[ss]", "unload", m->name));
    else if (!json_equal(m->config, json_object_get(cfg->plugins, m->name)))
      json_array_append_new(a->todo, json_pack("[ss]", "reload", m->name));
  }
  size_t i = 0;
  json_t *n = NULL;
  json_array_foreach(want, i, n) {
    if (!ah__host_find_mount(h, json_string_value(n)))
      json_array_append_new(a->todo, json_pack("[ss]", "load", json_string_value(n)));
  }
  json_decref(want);
  h->config = cfg;
  json_decref(h->describe_cache); /* it shows the configuration's hooks */
  h->describe_cache = NULL;
  apply_next(a);
  return 0;
}

/* ---- stop -------------------------------------------------------------------------------------------------
 */

typedef struct stop_ctx {
  ah_host *h;
  ah__done_fn cb;
  void *arg;
} stop_ctx;

static void stop_next(int status, void *arg);

static void pump_closed(void *ctx) {
  stop_ctx *s = ctx;
  ah__done_fn cb = s->cb;
  void *arg = s->arg;
  free(s);
  if (cb)
    cb(0, arg);
}

static void sessions_stopped(void *arg) {
  stop_next(0, arg);
}

static void stop_next(int status, void *arg) {
  (void)status;
  stop_ctx *s = arg;
  ah_host *h = s->h;
  /* Failed mounts still being torn down use the host: wait for them. */
  if (!ah__list_empty(&h->dying)) {
    ah_mount *m = AH__CONTAINER(h->dying.next, ah_mount, link);
    if (ah__mount_begin_withdraw(m, stop_next, s) == 0)
      return;
  }
  /* Withdraw plugins in reverse mount order; the core last. */
  for (ah__link *it = h->mounts.prev; it != &h->mounts; it = it->prev) {
    ah_mount *m = AH__CONTAINER(it, ah_mount, link);
    if (m == h->core)
      continue;
    if (m->state == AH__MOUNT_ACTIVE) {
      if (ah__mount_begin_withdraw(m, stop_next, s) == 0)
        return;
    } else if (m->state == AH__MOUNT_WITHDRAWING) {
      if (ah__mount_begin_withdraw(m, stop_next, s) == 0)
        return;
    }
  }
  /* Sessions stop after the surfaces are gone and before the core: running turns are cancelled and
   * recorded, leases released, the store closed. */
  if (h->sessions && !h->sessions_stopped) {
    h->sessions_stopped = true;
    ah__sessions_stop(h->sessions, sessions_stopped, s);
    return;
  }
  if (h->core && h->core->state == AH__MOUNT_ACTIVE) {
    ah_mount *core = h->core;
    if (ah__mount_begin_withdraw(core, stop_next, s) == 0)
      return;
  }
  h->core = NULL;
#ifdef AH_HAVE_HTTP
  ah__http_close(h);
#endif
  /* Deliver what is still queued, then close the pump. */
  ah__pump_close(&h->pump, pump_closed, s);
}

int ah__host_stop(ah_host *h, ah__done_fn cb, void *arg) {
  if (!h)
    return AH_EINVAL;
  if (h->stopping && h->core == NULL)
    return AH_ESTATE;
  h->stopping = true;
  stop_ctx *s = calloc(1, sizeof *s);
  if (!s)
    return AH_ENOMEM;
  s->h = h;
  s->cb = cb;
  s->arg = arg;
  AH_LOG_I("host", "stopping: withdrawing every plugin in reverse mount order");
  stop_next(0, s);
  return 0;
}

void ah__host_free(ah_host *h) {
  if (!h)
    return;
  json_decref(h->describe_cache);
  h->describe_cache = NULL;
  while (!ah__list_empty(&h->zombies)) {
    ah_mount *m = AH__CONTAINER(h->zombies.next, ah_mount, link);
    ah__list_remove(&m->link);
    /* Kept mapped: the module is never dlclose()d, only the host's record is freed. */
    ah__mount_free(m);
  }
  while (!ah__list_empty(&h->completions)) {
    ah__completion *c = AH__CONTAINER(h->completions.next, ah__completion, link);
    ah__list_remove(&c->link);
    json_decref(c->result);
    json_decref(c->data);
    free(c->message);
    free(c);
  }
  ah__sessions_free(h->sessions);
  ah__registry_free(&h->reg);
  ah__cancel_free(h->token);
  ah__audit_close(h);
  for (size_t i = 0; i < h->nrecs; i++) {
    ah_recorder_close(h->recs[i].rec);
    free(h->recs[i].surface);
  }
  free(h->recs);
  free(h->mode);
  free(h);
}

const char *ah__host_run_id(const ah_host *h) {
  return h ? h->run_id : NULL;
}

ah_recorder *ah__host_recorder(ah_host *h, const char *surface) {
  const ah_config *cfg = h ? h->config : NULL;
  if (!cfg || !cfg->record_dir || !surface)
    return NULL;
  if (cfg->record_surfaces) {
    bool listed = false;
    size_t i;
    json_t *e;
    json_array_foreach(cfg->record_surfaces, i, e) listed =
        listed || strcmp(json_string_value(e), surface) == 0;
    if (!listed)
      return NULL;
  }
  for (size_t i = 0; i < h->nrecs; i++)
    if (strcmp(h->recs[i].surface, surface) == 0)
      return h->recs[i].rec; /* NULL after a failure: not tried again */
  struct ah__host_rec *nr = realloc(h->recs, (h->nrecs + 1) * sizeof *nr);
  if (!nr)
    return NULL;
  h->recs = nr;
  char source[160], err[400] = "";
  snprintf(source, sizeof source, "host:%s", surface);
  json_t *meta = json_pack("{s:s, s:s, s:s, s:i}", "hostRunId", h->run_id, "hostVersion", AH_VERSION, "mode",
                           h->mode, "protocol", AH_PROTOCOL_VERSION);
  if (cfg->default_provider)
    json_object_set_new(meta, "provider", json_string(cfg->default_provider));
  json_t *pc = json_object_get(cfg->providers, cfg->default_provider ? cfg->default_provider : "");
  if (json_string_value(json_object_get(pc, "model")))
    json_object_set(meta, "model", json_object_get(pc, "model"));
  json_object_set_new(meta, "schemaVersion", json_integer(ah__store_schema_version()));
  ah_recorder_opts o = {.dir = cfg->record_dir,
                        .source = source,
                        .side = "host",
                        .max_bytes = cfg->record_max_bytes,
                        .max_files = cfg->record_max_files,
                        .meta = meta};
  ah_recorder *r = NULL;
  if (ah_recorder_open(&o, &r, err, sizeof err) != 0)
    AH_LOG_E("host", "the %s surface is not recorded: %s", surface, err);
  else
    AH_LOG_I("host", "recording the %s surface's connections to %s", surface, ah_recorder_path(r));
  json_decref(meta);
  h->recs[h->nrecs].surface = strdup(surface);
  h->recs[h->nrecs].rec = r;
  h->nrecs++;
  return r;
}
