/* agenthost — structures shared by the core's translation units (internal; never installed). */
#ifndef AGENTHOST_HOST_INTERNAL_H
#define AGENTHOST_HOST_INTERNAL_H

#include <ffi.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "agenthost/plugin.h"
#include "host.h"
#include "jsonrpc.h"
#include "log.h"
#include "pump.h"

/* An intrusive doubly linked list (libuv's QUEUE idea, written out plainly). */
typedef struct ah__link {
  struct ah__link *prev;
  struct ah__link *next;
} ah__link;

void ah__list_init(ah__link *head);
bool ah__list_empty(const ah__link *head);
void ah__list_push(ah__link *head, ah__link *node);   /* at the tail */
void ah__list_remove(ah__link *node);                 /* safe on a node that is not linked */
void ah__list_take_all(ah__link *dst, ah__link *src); /* dst (uninitialized) gets every node; src is empty */
#define AH__CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define AH__LIST_EACH(it, head) for (ah__link *it = (head)->next; it != (head); it = it->next)

char *ah__strdup(const char *s); /* NULL-safe */
/* A JSON string of the `n` bytes at `s`, every invalid UTF-8 sequence replaced by U+FFFD (its maximal
 * subpart, as Unicode recommends). New reference; NULL when out of memory. */
json_t *ah__json_lossy_string(const char *s, size_t n);
/* The UTF-8 sequence at s (n ≥ 1 bytes left): its length when valid; else minus the length of its maximal
 * valid prefix (at least 1), with *cut set when that prefix was cut short by the end of the input. */
int ah__utf8_seq(const unsigned char *s, size_t n, bool *cut);
void ah__time_rfc3339(char out[32]); /* now, UTC, milliseconds: 2026-11-30T17:15:03.123Z */
uint64_t ah__time_ms(void);          /* now, Unix milliseconds */
void ah__wipe_free(char *secret);    /* zero a secret string, then free it (NULL: nothing) */
void ah__uuid7(char out[37]);        /* a new UUIDv7 (text), sorting by creation time */
/* mkdir -p with mode 0700 for what is created. Returns 0 or -errno; *failed (may be NULL) names the path
 * that could not be created (static storage until the next call). */
int ah__mkdirs(const char *dir, const char **failed);

/* ---- cancellation (cancel.c) ---------------------------------------------------------------------- */

struct ah_cancel {
  ah_cancel *parent;
  ah__link children;
  ah__link sibling;
  ah__link watches;
  atomic_bool tripped;
  bool fired;      /* watches and children processed */
  ah_mount *owner; /* set for tokens a plugin made with token_new (freed at withdraw if left) */
  ah__link owner_link;
};

struct ah_cancel_watch {
  ah_cancel *token;
  ah_cancel_fn fn;
  void *arg;
  bool fire_on_free; /* a link to another token: freeing this one cancels that one too */
  ah__link link;
};

ah_cancel *ah__cancel_new(ah_cancel *parent);
void ah__cancel_trip(ah_cancel *t);
void ah__cancel_free(ah_cancel *t); /* detaches children; deferred while a trip is running */
bool ah__cancel_tripped(const ah_cancel *t);
int ah__cancel_watch(ah_cancel *t, ah_cancel_fn fn, void *arg, ah_cancel_watch **out);
void ah__cancel_unwatch(ah_cancel_watch *w);

/* ---- registry (registry.c) ------------------------------------------------------------------------ */

typedef enum ah__entry_kind {
  AH__ENTRY_INVALID = 0,
  AH__ENTRY_METHOD,
  AH__ENTRY_EVENT,
  AH__ENTRY_REMOTE,
  AH__ENTRY_NAMESPACE,   /* a remote namespace, owned by the first mount that uses it */
  AH__ENTRY_PROVIDER,    /* a provider type ("acp"); `data` is the plugin's ah_provider */
  AH__ENTRY_TOOL,        /* a plugin's tool; `meta` {description, schema} */
  AH__ENTRY_TOOL_SOURCE, /* a tool source (ABI 1.6), named by its prefix; `handler` runs a tool, `list` lists
                          */
  AH__ENTRY_HOOK,        /* a plugin's hook (ABI 1.7); `meta` {event, match, timeout_ms, on_error} */
} ah__entry_kind;

typedef enum ah__entry_state {
  AH__ST_INVALID = 0,
  AH__ST_STAGED,
  AH__ST_ACTIVE,
  AH__ST_WITHDRAWN,
} ah__entry_state;

typedef struct ah__remote {
  char *ns;
  char *method;
  ah_remote_param *params; /* names copied */
  size_t nparams;
  ah_type result;
  bool result_optional;
  uint32_t flags;
  ah_lookup lookup;
  ah_remote_fn fn;
  void *data;
  ffi_cif cif;
  ffi_type **arg_types; /* nparams + 2 (call, out) */
  unsigned nargs;
} ah__remote;

typedef struct ah__entry {
  ah__entry_kind kind;
  ah__entry_state state;
  char *name; /* method name, event name, "ns.method" for a remote, ns for a namespace */
  ah_mount *mount;
  uint32_t flags;
  ah_method_fn handler;
  void *data;
  ah__remote *remote;
  json_t *meta;      /* a tool's {description, schema} */
  ah_method_fn list; /* a tool source's list handler */
  ah__link journal;  /* in the mount's journal, registration order */
  struct ah__entry *hash_next;
} ah__entry;

typedef struct ah__registry {
  ah__entry **buckets;
  size_t nbuckets;
  json_t *tombstones; /* {"kind:name": true}: withdrawn names that fail closed until registered again */
  uint64_t gen;       /* bumped whenever what is visible changes (publish, withdraw, remove) */
} ah__registry;

int ah__registry_init(ah__registry *r);
void ah__registry_free(ah__registry *r);
ah__entry *ah__registry_find(ah__registry *r, ah__entry_kind kind, const char *name);
/* The provider type `type` of an active plugin, or NULL; *mount (may be NULL) gets its mount. */
ah_provider *ah__registry_provider(ah__registry *r, const char *type, ah_mount **mount);
bool ah__registry_tombstoned(ah__registry *r, ah__entry_kind kind, const char *name);
/* The active plugin tools, sorted by name: [{name, description, schema}] (new array). */
json_t *ah__registry_tools(ah__registry *r);
/* True when a plugin's tool (staged or active) has a name beginning with `prefix`. */
bool ah__registry_tool_under(ah__registry *r, const char *prefix);
/* Stage an entry for `m` (journal + table). Returns AH_EEXIST / AH_ENOMEM. */
int ah__registry_stage(ah__registry *r, ah_mount *m, ah__entry *e);
void ah__registry_publish(ah__registry *r, ah_mount *m);  /* STAGED → ACTIVE, tombstones cleared */
void ah__registry_withdraw(ah__registry *r, ah_mount *m); /* ACTIVE → WITHDRAWN */
void ah__registry_remove(ah__registry *r, ah_mount *m, bool tombstone); /* reverse order, freed */
void ah__entry_free(ah__entry *e);

bool ah__valid_method_name(const char *s);
json_t *ah__describe_remote(const ah__entry *e); /* host.c: a descriptor as host.describe shows it */

/* ---- the remote gateway (remote.c; ah_host_api.remote_describe / remote_invoke) ----------------------- */

json_t *ah__remote_describe(ah_host *h);

int ah__remote_invoke(ah_host *h, const ah_caller *caller, const char *ns, const char *method,
                      const json_t *args, ah_cancel *parent, ah_reply_fn cb, void *arg);
bool ah__valid_event_name(const char *s);
bool ah__valid_plugin_name(const char *s);
/* dlopen + the entry symbol + the ABI check (plugins.c): *dl_out and *desc_out on success; else a negative
 * AH_E* with *why (malloc'ed, may be NULL) naming the field. */
int ah__plugin_open(const char *path, void **dl_out, const ah_plugin_desc **desc_out, char **why);
int ah__remote_prepare(ah_mount *m, const ah_remote_def *def, ah__remote **out);
void ah__remote_free(ah__remote *r);
const char *ah__type_name(ah_type t);

/* ---- mounts (mount.c, plugins.c) ------------------------------------------------------------------ */

typedef enum ah__mount_state {
  AH__MOUNT_INVALID = 0,
  AH__MOUNT_MOUNTING, /* inside mount(): registrations allowed */
  AH__MOUNT_ACTIVE,
  AH__MOUNT_WITHDRAWING,
  AH__MOUNT_GONE,   /* withdrawn and unloaded */
  AH__MOUNT_ZOMBIE, /* withdrawn, kept mapped */
} ah__mount_state;

typedef struct ah__range {
  uintptr_t start;
  uintptr_t end;
} ah__range;

typedef struct ah__waiter {
  ah__done_fn cb;
  void *arg;
  ah__link link;
} ah__waiter;

struct ah_mount {
  ah_host *host;
  ah__mount_state state;
  char *name;
  char *version;
  char *description;
  char *path; /* NULL for the core */
  json_t *config;
  bool from_config; /* mounted by the configuration (SIGHUP manages it) */
  void *dl;
  int (*mount_fn)(ah_mount *, const ah_host_api *, const json_t *, void **);
  void (*withdraw_fn)(ah_mount *, void *, ah_withdraw_done_fn);
  int (*may_withdraw_fn)(void *);
  void *state_ptr;
  bool registration_failed;
  bool used_raw_loop;
  ah__range *ranges; /* code and data of the module and of the libraries it brought in */
  size_t nranges;
  ah__link journal;
  ah_cancel *token;
  ah__link calls; /* in-flight ah_call (not yet finished by the plugin) */
  size_t ncalls;
  ah__link subs;
  ah__link timers;
  ah__link https; /* HTTP transfers (http.c) */
  ah__link works; /* queued or running pool work */
  size_t nworks;
  ah__link procs;
  ah__link tokens; /* tokens made with token_new */
  ah__link posts;
  ah__link records; /* connection recordings open (record_open, ABI 1.9) */
  size_t closing;   /* host handles of this mount whose close callback is pending */
  /* Set by the withdraw machine (mount.c): called after every release (holds.c), so that the files that
   * count work never call into it. */
  void (*on_release)(ah_mount *m, int kind);
  /* withdraw */
  uv_timer_t phase_timer;
  uv_timer_t deadline_timer;
  int phase;
  bool drain_timed_out;
  bool done_called;
  bool call_withdraw; /* the plugin's withdraw() runs (not after a mount() that returned an error) */
  bool published;     /* its registrations became visible (plugin.withdrawn is emitted for it) */
  ah__link waiters;
  ah__link link; /* in the host's mounts or zombies */
};

/* ---- calls (calls.c) ------------------------------------------------------------------------------ */

struct ah_call {
  ah_call_head head; /* first: the public head (plugin.h) */
  ah_host *host;
  ah_mount *mount;
  ah__entry *entry;
  ah_caller caller; /* surface copied below */
  char *surface;
  char *method;
  json_t *params;
  ah_cancel *token;
  ah_cancel_watch *parent_watch;
  bool cancellable;
  bool audited;       /* a privileged method or descriptor: the outcome goes to the audit log */
  char *fail_message; /* a remote function's own word on its error (call_set_message) */
  ah_reply_fn cb;
  void *arg;
  bool answered; /* the caller got (or is about to get) its outcome */
  bool finished; /* the plugin answered */
  /* A tool's call: where call_progress goes (with `arg`); NULL for other calls. */
  void (*progress)(const json_t *progress, void *arg);
  ah__link link; /* in the mount's calls */
};

typedef struct ah__completion {
  ah_reply_fn cb;
  void *arg;
  int status;
  json_t *result;
  char *message;
  json_t *data;
  ah__link link;
} ah__completion;

/* Queue a caller's outcome for delivery on a later loop turn. `result`/`data` stolen. */
void ah__complete(ah_host *h, ah_reply_fn cb, void *arg, int status, json_t *result, const char *message,
                  json_t *data);
int ah__call_reply(ah_call *c, json_t *result);
ah_cancel *ah__call_cancel_token(ah_call *c);
const ah_caller *ah__call_caller(ah_call *c);
void ah__call_set_message(ah_call *c, const char *message);
int ah__call_error(ah_call *c, int status, const char *message, json_t *data);
/* Create the call of `e` (a method or a remote descriptor, named `name`) for `caller` and count it on
 * e->mount. `params` is stolen. Returns AH_ENOMEM, or 0 with *out = the call — or *out = NULL when
 * `parent` had already tripped (the caller is then answered `cancelled` and nothing runs). */
int ah__call_new(ah_host *h, ah__entry *e, const ah_caller *caller, const char *name, json_t *params,
                 bool cancellable, bool audited, ah_cancel *parent, ah_reply_fn cb, void *arg, ah_call **out);
bool ah__privileged(ah_authority a); /* loopback with a token, the stdio owner, the admin socket */
/* Answer every unanswered call of `m` with `cancelled`. */
void ah__calls_cancel_mount(ah_mount *m);

/* ---- bus (bus.c) ---------------------------------------------------------------------------------- */

struct ah_sub {
  ah_host *host;
  ah_mount *mount;
  char *pattern;
  ah_event_fn fn;
  void *arg;
  bool active;
  uint64_t pass; /* the last delivery pass that served it */
  json_t *queue; /* [[name, data], ...]; those before qhead are delivered */
  size_t qhead;
  ah__link host_link;
  ah__link mount_link;
};

int ah__bus_emit(ah_host *h, ah_mount *m, const char *name, json_t *data);
int ah__bus_subscribe(ah_host *h, ah_mount *m, const char *pattern, ah_event_fn fn, void *arg, ah_sub **out);
void ah__bus_unsubscribe(ah_sub *s);
/* The pump's drain of bus events (`host` is the ah_host): one delivery pass, and whether events wait. */
void ah__bus_deliver(void *host);
bool ah__bus_pending(void *host);
bool ah__pattern_match(const char *pattern, const char *name);

/* ---- services (services.c, process.c) ------------------------------------------------------------- */

struct ah_timer {
  uv_timer_t handle;
  ah_mount *mount;
  ah_timer_fn fn;
  void *arg;
  bool stopped;
  bool in_callback;
  ah__link link;
};

typedef struct ah__post {
  ah_mount *mount;
  ah_task_fn fn;
  void *arg;
  ah__link link; /* in the host's queue */
  ah__link mount_link;
} ah__post;

typedef struct ah__work {
  uv_work_t req;
  ah_mount *mount;
  ah_work_fn work;
  ah_after_fn after;
  void *arg;
  ah__link link;
} ah__work;

struct ah_process {
  uv_process_t handle;
  uv_pipe_t pipes[3];
  bool has_pipe[3];
  ah_mount *mount;
  ah_exit_fn on_exit;
  void *arg;
  int pid;
  bool exited;
  int64_t exit_status;
  int term_signal;
  int open_handles; /* process + pipes not yet closed */
  bool orphaned;    /* the mount is gone: never call on_exit */
  uv_timer_t kill_timer;
  bool kill_timer_used;
  uint64_t kill_deadline; /* loop time when SIGKILL follows SIGTERM */
  bool kill_sent;
  uv_timer_t drain_timer; /* after the exit: the output pipes' last second */
  uv_check_t drain_check; /* after the exit: closes the output pipes once their readers stopped */
  /* stderr_to_log (ABI 1.6): the host reads stderr into lines for its log. */
  bool err_logged;
  char *err_tag;
  char err_line[512];
  size_t err_len;
  bool err_cut;
  size_t err_total;
  ah__link link;
};

extern ah_host_api ah__api_table; /* .rpc is filled by ah__host_new() */

void ah__services_withdraw(ah_mount *m); /* stop what the plugin left: timers, posts, processes, tokens */
void ah__services_quiesce(ah_mount *m);  /* a plugin not done yet: stop its timers and posts, free nothing */
void ah__stdio_release(ah_mount *m);     /* close the stdio streams a mount holds */
void ah__services_cancel_work(ah_mount *m);
int ah__spawn(ah_host *h, ah_mount *m, const ah_process_opts *opts, ah_process **out);
int ah__process_kill(ah_process *p, uint64_t grace_ms);
/* Build the child environment: allowlist from `parent` plus `extra`; NULL-terminated, malloc'ed. */
char **ah__child_env(char *const *parent, const char *const *extra);
void ah__child_env_free(char **env);

/* ---- host (host.c) -------------------------------------------------------------------------------- */

struct ah__host_rec {
  char *surface;
  struct ah_recorder *rec;
};

struct ah_host {
  uv_loop_t *loop;
  char run_id[37];           /* this host run's id (a UUIDv7): in recordings' metadata and host.describe */
  struct ah__host_rec *recs; /* the surfaces' recorders, opened on first use ([host] record_dir) */
  size_t nrecs;
  const ah_config *config;
  char *mode;
  uint64_t drain_ms;
  bool stopping;
  bool keep_mapped;
  ah__registry reg;
  ah_cancel *token; /* root: host → mount → call */
  ah_mount *core;
  ah__link mounts; /* mount order */
  ah__link zombies;
  ah__link dying; /* failed mounts being torn down (not visible, but stop waits for them) */
  ah__link subs;
  ah__link completions;
  ah__link posts;
  ah__pump pump;
  size_t inflight;
  uint64_t bus_pass;
  json_t *describe_cache; /* host.describe, valid while reg.gen == describe_gen (read-only for callers) */
  uint64_t describe_gen;
  int describe_store;           /* the store state the cache was built with (ah__sessions_store_state) */
  int audit_fd;                 /* state_dir/audit.log, append-only; -1 without a configuration */
  struct ah_sessions *sessions; /* NULL without a state directory */
  struct ah__http_ctx *http;    /* the HTTP client, made on first use (http.c) */
  /* stdio for a stdio surface (api->stdio) */
  uv_stream_t *stdio_in;
  uv_stream_t *stdio_out;
  ah_mount *stdio_owner;
  int stdio_closing;
  /* Told synchronously when a mount starts its withdraw, while its code is mapped (the sessions end the
   * turns on its providers); set by the host when it has sessions. */
  void (*on_withdraw)(void *arg, ah_mount *m);
  void *on_withdraw_arg;
  void (*on_stop_request)(int exit_code, void *arg);
  void *stop_request_arg;
  bool sessions_stopped;
};

/* ---- the core's own use of the host services (services.c): the functions behind ah__api_table ---------- */
int ah__services_register_method(ah_mount *m, const ah_method_def *def);
int ah__services_register_event(ah_mount *m, const char *name, uint32_t flags);
int ah__services_timer_start(ah_mount *m, uint64_t timeout_ms, uint64_t repeat_ms, ah_timer_fn fn, void *arg,
                             ah_timer **out);
void ah__services_timer_stop(ah_timer *t);
int ah__services_post(ah_mount *m, ah_task_fn fn, void *arg);
int ah__services_queue_work(ah_mount *m, ah_work_fn work, ah_after_fn after, void *arg);
int ah__services_spawn(ah_mount *m, const ah_process_opts *opts, ah_process **out);
uv_stream_t *ah__process_stdout(ah_process *p);
uv_stream_t *ah__process_stderr(ah_process *p);
void *ah__process_arg(ah_process *p);
ah_process *ah__process_of_stream(uv_stream_t *s);
void ah__process_close_stdin(ah_process *p);

/* ---- the audit log (audit.c) ----------------------------------------------------------------------------
 */

/* Append one audit record for a privileged call: method, caller and outcome, never values. */
void ah__audit(ah_host *h, const char *method, const ah_caller *caller, int status);
void ah__audit_open(ah_host *h); /* state_dir/audit.log; a warning when it cannot be opened */
void ah__audit_close(ah_host *h);

/* ---- the pump's drains (pump.h): call outcomes (calls.c), posted tasks (services.c); bus events above */
void ah__calls_drain(void *host);
bool ah__calls_pending(void *host);
void ah__services_drain_posts(void *host);
bool ah__services_posts_pending(void *host);

ah_mount *ah__host_find_mount(ah_host *h, const char *name);
int ah__host_register_core(ah_host *h); /* core_methods.c */
/* ---- what a mount has in flight (holds.c): read by the withdraw machine ------------------------------- */

enum {
  AH__HOLD_CALL = 1, /* a call the plugin has not finished (ncalls) */
  AH__HOLD_WORK,     /* queued or running pool work (nworks) */
  AH__HOLD_CLOSE,    /* a host handle of the mount whose close callback is pending (closing) */
};
void ah__mount_hold(ah_mount *m, int kind);
/* Close the recordings a plugin left open (services.c). */
void ah__records_close_all(ah_mount *m);
void ah__mount_release(ah_mount *m, int kind); /* then m->on_release, when set */
bool ah__mount_in_module(const ah_mount *m, const void *addr);
/* Record the address ranges of `dl` and of the objects that appeared since `before` (a JSON array of
 * object names from ah__loaded_objects()). */
int ah__mount_record_ranges(ah_mount *m, json_t *before);
json_t *ah__loaded_objects(void);
int ah__mount_begin_withdraw(ah_mount *m, ah__done_fn cb, void *arg);
void ah__mount_free(ah_mount *m);

/* ---- JSON-RPC peers (jsonrpc.c) --------------------------------------------------------------------- */

/* The number of live peers (not yet freed) with a callback for which `inside(addr, arg)` is true: the
 * zombie check asks whether a plugin left a peer whose callbacks point into its module. */
size_t ah__rpc_peers_referencing(bool (*inside)(const void *addr, void *arg), void *arg);

#endif
