/* The sessions engine inside the core (internal to host/sessions/): the types of the manager, a live
 * session, a turn and a server request, and the functions its files share. sessions.h is what the rest of
 * the host sees.
 *
 * manager.c    the manager: store, start, stop, the gateway of sessions.h
 * live.c       live sessions: load, leases, prompt queue, create, close, release
 * writes.c     every durable write: events with their seq, row updates, the running status
 * requests.c   server requests (approvals, questions) and their answers
 * turns.c      turns, the provider sink, the tools a turn runs
 * subagents.c  child sessions of a turn
 * hookpoints.c the hooks' points: their documents, the chains a turn waits for, the observing ones
 * options.c    the session's options (model, mode, reasoning effort): listed, validated, set
 * methods.c    the methods session.* and request.*
 */
#ifndef AGENTHOST_HOST_SESSIONS_SESSION_H
#define AGENTHOST_HOST_SESSIONS_SESSION_H

#include <jansson.h>
#include <stdbool.h>
#include <string.h>

/* uthash: the tables by id (live sessions, pending requests). Out of memory in a table is fatal, as an
 * allocation the loop cannot go on without. */
#define uthash_fatal(msg) abort()
#include <uthash.h>

#include "../internal.h"
#include "../providers/echo.h"
#include "../sessions.h"
#include "../tools.h"

#define LOG "sessions"

typedef struct ah_session session; /* the plugin API's ah_session */
typedef struct ah_hosts ah_hosts;  /* hosts.c */
typedef struct turn turn;
typedef struct request request;

typedef void (*lookup_fn)(int status, session *s, void *arg);

typedef struct waiter {
  lookup_fn cb;
  void *arg;
  ah__link link;
} waiter;

typedef struct queued {
  char *message_id;
  json_t *content;
  ah__link link;
} queued;

struct ah_sessions {
  ah_host *host;
  ah_mount *core;
  ah_store *store; /* the configuration is read through the host: SIGHUP replaces it */
  uint64_t lease_ttl;
  bool renewing; /* a lease.renew is being written */
  int max_depth;
  bool stopping;
  char owner[160];
  char hostname[64];
  ah__link sessions; /* live (loaded or loading), in load order */
  session *by_id;    /* the same, by id (uthash) */
  size_t nlive;
  size_t loads;
  size_t unloads;           /* idle sessions that left memory */
  size_t trimmed_at;        /* unloads at the last malloc_trim */
  uint64_t reads_seen;      /* the store's reads at the last idle tick */
  uint64_t reads_at_shrink; /* the store's reads when its caches were last given back */
  /* Idle unload ([host] idle_unload_s): the sweep's timer and period (ms); 0: not running */
  ah_timer *idle_timer;
  uint64_t idle_period;
  ah_provider *echo;
  ah_timer *lease_timer;
  ah__link requests; /* pending server requests, in creation order */
  request *requests_by_id;
  ah__link turns;   /* every turn not yet freed (also ended ones waiting for their posted free) */
  json_t *resolved; /* request id → {state, by}: the recent resolutions, for late-answer receipts */
  json_t *resolved_order;
  void (*stop_cb)(void *arg);
  void *stop_arg;
  ah_timer *stop_deadline;
  bool stop_finishing;
  bool recover_on_start;
  char *store_path; /* the store is opened on first use when opts.lazy_store */
  char *store_url;  /* or, PostgreSQL: its connection string and password ([host] store_url) */
  char *store_password;
  const ah_store_backend *store_backend;
  ah_store_sync store_sync;
  bool store_failed;
  /* Sessions whose writes failed (disk full, I/O error): reloaded from the store once writes succeed,
   * which records their interrupted turn. {id: true} */
  json_t *retry;
  ah_timer *retry_timer;
  /* Several hosts on one store (hosts.c): NULL unless the store has signals. */
  ah_hosts *hosts;
  /* [host] prices, read when first needed and again when the configuration names another file */
  struct ah_prices *prices;
  char *prices_path;
};

struct ah_session {
  ah_sessions *m;
  char *id;
  json_t *row; /* the stored session row, kept current */
  int64_t seq;
  bool ready;    /* loaded, lease held */
  bool to_close; /* being loaded only to be closed (no cwd check) */
  bool closing;  /* close requested: no new prompts */
  bool running;
  ah__link queue;
  turn *turn;
  ah__link waiters;
  /* A subagent: the parent's turn waiting for the turn of `parent_message` to end. */
  turn *parent_turn;
  char *parent_message;
  ah__link close_waiters; /* ah_call * answered when the close completed */
  int pending_writes;     /* store writes in flight for this session (it is freed after the last) */
  int holds;              /* remote calls running with this session (ah__session_hold) */
  bool disposed;
  bool fenced; /* its lease is held: every write carries the fence (the store checks the owner) */
  bool lost;   /* a fenced write found the lease taken by another process: it runs here no more */
  bool broken; /* a write failed (disk full, I/O error): it runs no more until reloaded (m->retry) */
  /* A turn ended and its turn/ended is not stored yet: the next turn waits, so that whatever it reads of
   * the conversation (the provider's history) has every earlier turn's messages. */
  bool end_unwritten;
  bool close_hooked; /* the session_close hooks ran (or are running) */
  /* Idle unload: when it was last busy or asked for (ms, the loop's clock); the follows (session.follow)
   * keeping it live. */
  uint64_t active_ms;
  ah__link follows;
  /* The client's editor (session.set-editor): the methods read_file and write_file go through; live only,
   * set again by the surface whenever it attaches. */
  struct {
    char *read, *write, *run;
  } editor;
  ah__link link;
  UT_hash_handle hh;
};

struct turn {
  session *s;
  ah_sessions *m; /* the turn may outlive its session's memory until its posted free */
  char id[37];
  char *message_id;
  json_t *content;
  ah_cancel *cancel;
  ah_provider *prov;
  ah_mount *prov_mount; /* the plugin providing `prov`; NULL for the embedded echo */
  ah_provider_turn *pt;
  ah__link all;       /* in the manager's `turns` until freed */
  bool provider_gone; /* its plugin is being withdrawn: the turn ends with that error */
  bool ended;
  bool cancelled;
  json_t *last_text; /* the last committed text (a JSON string), for a waiting parent */
  int tools_running;
  request *pending;     /* an approval or question waiting for an answer */
  json_t *history;      /* built on the provider's first sink->history() call */
  json_t *history_page; /* the recent window of the session's events, read before the turn started */
  /* The provider ended while tools still ran: the end is recorded once they stopped, so turn/ended is
   * always the turn's last event. */
  bool end_pending;
  char *end_reason;
  json_t *end_usage;
  char *end_error;
  session *child; /* a subagent running for this turn */
  char *child_message;
  /* The tools offered to the provider (asked of the tool sources before it starts: meanwhile `gathering`,
   * counted in tools_running so that an end waits for the answers); a tool call must name one of them. */
  json_t *tools;
  bool gathering;
  /* Usage: the round trips the provider reported (model/usage events) and the model asked for */
  int rounds;
  char requested_model[128];
};

struct request {
  ah_sessions *m;
  char id[37];
  char *session_id;
  char *turn_id;
  char *kind; /* "approval" | "question" */
  json_t *params;
  json_t *options;
  turn *t;
  /* Approval: the tool to run once granted. */
  char *call_id;
  char *tool;
  json_t *args;
  bool answering; /* a shared store: an answer given here is being stored (ah__request_answer) */
  ah__link link;
  UT_hash_handle hh;
};

typedef void (*written_fn)(session *s, int status, const json_t *event, void *arg);

static inline const char *str(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static inline const char *status_of(const session *s) {
  return s->running ? "running" : "idle";
}

/* accounting.c: usage as durable facts (docs/usage.md). ah__usage_account adds `usage` (a provider's
 * {inputTokens, …}; NULL: none) attributed to `model` (NULL: not attributed) to the session's row and
 * returns the session.update operation to commit with the event that reports it (NULL when nothing
 * changes); `turn` counts one more turn. ah__usage_public sets usage, treeUsage, cost?, treeCost? on
 * `pub` from `row` and `tree` (the store's AH_STORE_Q_TREE of the session; NULL: no treeUsage). */
json_t *ah__usage_account(session *s, const char *model, const json_t *usage, bool turn);
void ah__usage_public(ah_sessions *m, json_t *pub, const json_t *row, const json_t *tree);

/* manager.c */
ah_store *ah__sm_store(ah_sessions *m);
json_t *ah__sm_public_row(const json_t *row, const char *status);
void ah__sm_emit(ah_sessions *m, const char *name, json_t *data);
void ah__sm_check_stopped(ah_sessions *m);
/* session.updated {sessionId, title, tags, updated} for a change of the row's shown fields; `changed`
 * ({sessionId, updated}) is stolen and completed from the live row. */
void ah__session_changed(session *s, json_t *changed);

/* options.c */
/* The options of a session's row (stored or live): [{id, name, description, category, type, currentValue,
 * options: [{value, name, description?}]}]. New reference. */
json_t *ah__session_options_of(ah_sessions *m, const json_t *row);
json_t *ah__session_options(session *s);
/* The row's mode (ask | accept_edits | read_only: its own, else [host] default_mode) and reasoning effort
 * (its own, else the provider's reasoning_effort; NULL = none). */
const char *ah__session_mode_of(ah_sessions *m, const json_t *row);
const char *ah__session_effort_of(ah_sessions *m, const json_t *row);
/* Set option `id` to `value` (one of its values): stored with the row, announced as session.options. 0, or
 * AH_EINVAL / AH_ECLOSED with `why` naming the field. `check_only`: only the check. */
int ah__session_set_option(session *s, const char *id, const json_t *value, bool check_only, char *why,
                           size_t cap);

/* live.c */
session *ah__live_find(ah_sessions *m, const char *id);
void ah__live_free_if_unused(session *s);
void ah__live_renew_leases(ah_timer *t, void *arg);
void ah__live_wake(session *s, int status);
/* `holder`: who holds the lease now, when known (NULL: read for the log). */
void ah__live_lease_lost(session *s, const char *why, const char *holder);
void ah__live_broken(session *s, int status);
/* The live session `id`, loaded (its lease taken) if it is cold; AH_EUNAVAILABLE when its working directory
 * does not exist on this host. _to_close loads it for a close, wherever its directory is. */
void ah__live_lookup(ah_sessions *m, const char *id, lookup_fn cb, void *arg);
void ah__live_lookup_to_close(ah_sessions *m, const char *id, lookup_fn cb, void *arg);
int ah__live_create(ah_sessions *m, const char *cwd, const char *provider, const char *model,
                    const char *title, const char *parent, bool local, int depth, lookup_fn cb, void *arg);
void ah__live_enqueue(session *s, json_t *content, written_fn cb, void *arg, char out_id[37]);
/* The same for a prompt stored already under `mid` (posted by another host): `ops` (stolen) are written
 * with its inbox/received; `claim`: an idle agent claims it at once. */
void ah__live_enqueue_as(session *s, const char *mid, json_t *content, json_t *ops, bool claim, written_fn cb,
                         void *arg);
void ah__live_finish_close(session *s);
void ah__live_close(session *s, ah_call *call);
void ah__live_release(session *s);
/* The idle sweep ([host] idle_unload_s): started with the manager, it re-arms itself when the configured
 * time changes (SIGHUP). */
void ah__live_idle_start(ah_sessions *m);
void ah__live_idle_stop(ah_sessions *m);
/* session.follow: `call` (cancellable) keeps `s` live until its token trips or the session stops here. */
int ah__live_follow(session *s, ah_call *call);

/* writes.c */
void ah__write_ops(session *s, json_t *ops, const char *kind, const char *turn_id, const char *message_id,
                   json_t *data, written_fn cb, void *arg);
void ah__write_event(session *s, const char *kind, const char *turn_id, const char *message_id, json_t *data);
void ah__write_fields(session *s, json_t *set);
void ah__write_running(session *s, bool running);

/* requests.c */
json_t *ah__request_json(const request *r);
request *ah__request_new(turn *t, const char *kind, json_t *params, json_t *options);
void ah__request_free(request *r);
request *ah__request_find(ah_sessions *m, const char *id);
void ah__request_resolve(request *r, const char *state, const json_t *answer, const char *option_id,
                         const ah_caller *by);
bool ah__request_is_option(const json_t *options, const char *id);
/* The request's row was answered by another host (the store has its answer): act on it here as on an
 * answer given here, without writing the row again. Nothing when it is still pending in the store. */
void ah__request_adopt(request *r);
/* The opset that resolves request `id` of session `sid` to `state` (with `answer`, borrowed; may be NULL),
 * signalling the other hosts with a shared store. */
json_t *ah__request_state_ops(ah_sessions *m, const char *id, const char *sid, const char *state,
                              const json_t *answer);
/* An answer given here (request.respond) to `call`: resolved at once, or with a shared store once its row
 * took it (another host may have answered first: then that answer is acted on and `call` is told
 * {accepted: false, reason: "resolved"}). */
void ah__request_answer(request *r, const char *state, const json_t *answer, const char *option_id,
                        ah_call *call);

/* turns.c */
ah_provider *ah__turn_provider(ah_sessions *m, const char *name, ah_mount **mount, const json_t **config);
void ah__turn_end(turn *t, const char *reason, json_t *usage, const char *error);
void ah__turn_tool_refused(turn *t, const char *call_id, const char *name, const char *why);
void ah__turn_run_tool(turn *t, const char *call_id, const char *name, const json_t *args);
void ah__turn_claim(session *s);

/* hookpoints.c (ah_hook_verdict: host/hooks.h) */
struct ah_hook_verdict;
typedef void (*ah_turn_hooks_fn)(turn *t, const struct ah_hook_verdict *v, void *arg);
/* {sessionId, turnId?, cwd, provider, model?}: what every hook document has. New reference. */
json_t *ah__hook_doc(session *s, const turn *t);
/* Run the hooks of `point` (for `tool`, may be NULL) for turn `t` with `doc` (stolen); each run is written
 * as a `hook/ran` event of the turn; `fn` gets the verdict on a later loop turn (the chain counts as a
 * running tool meanwhile). Returns 1 (started), 0 (no hook there: `fn` is not called) or AH_ENOMEM. */
int ah__turn_hooks(turn *t, const char *point, const char *tool, const char *call_id, json_t *doc,
                   ah_turn_hooks_fn fn, void *arg);
/* The same for an observing point of session `s` (held in memory meanwhile; not cancelled with a turn);
 * `then` (may be NULL) runs after the chain. Returns 1, 0 (no hook: `then` not called) or AH_ENOMEM. */
int ah__session_hooks(session *s, const char *point, json_t *doc, void (*then)(session *s, void *arg),
                      void *arg);

/* hosts.c: several hosts on one store (docs/scaling.md) */
void ah__hosts_start(ah_sessions *m);
void ah__hosts_stop(ah_sessions *m);
void ah__hosts_free(ah_sessions *m);
bool ah__hosts_active(const ah_sessions *m);
bool ah__hosts_runs_here(ah_sessions *m, const char *sid);
bool ah__hosts_hold(ah_sessions *m, const char *name, json_t *data);
void ah__hosts_committed(ah_sessions *m, int64_t cursor);
void ah__hosts_adopt(session *s, const json_t *rows);
void ah__hosts_sweep(ah_sessions *m);
json_t *ah__hosts_requests(ah_sessions *m, const json_t *rows);
void ah__hosts_post_prompt(ah_sessions *m, const char *sid, json_t *content, ah_call *call);
void ah__hosts_post_cancel(ah_sessions *m, const json_t *row, ah_call *call);
void ah__hosts_answer(ah_sessions *m, const json_t *row, const char *state, json_t *answer, ah_call *call);

/* subagents.c */
session *ah__subagent_start(session *parent, turn *t, const char *prompt, int *rc);
void ah__subagent_notify_parent(session *child, const char *message_id, const char *reason, const char *text);

#endif
