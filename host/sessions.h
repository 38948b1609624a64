/* agenthost — sessions, agents, turns, subagents and server requests (internal).
 *
 * The session manager is part of the core: it owns the store, the live agents and the pending server
 * requests, and registers the core methods session.*, request.* (core_methods.c calls
 * ah__sessions_register). Surfaces reach it only through those methods and the bus.
 *
 * Stored event kinds (each with a per-session seq without gaps; docs/sessions.md has the vocabulary):
 *   inbox/received {content}              messageId         a prompt was accepted (durable receipt)
 *   inbox/claimed {}                      messageId, turnId the agent took it
 *   turn/started {provider, model}        messageId, turnId
 *   message/committed {role, text}        turnId
 *   tool/call {callId, name, args}        turnId
 *   tool/approval {callId, name, requestId, outcome, optionId?}  turnId
 *   tool/result {callId, name, result, isError}                  turnId
 *   question/asked {requestId, question, options}                turnId
 *   question/answered {requestId, answer?, outcome}              turnId
 *   subagent/started {sessionId, prompt, local}                  turnId
 *   subagent/finished {sessionId, reason, text}                  turnId
 *   turn/ended {reason, usage, error?}    messageId, turnId
 *   agent/error {message}                 turnId?           a failure outside any provider turn
 * Transient (bus only): session.delta {sessionId, turnId, messageId, text}.
 */
#ifndef AGENTHOST_HOST_SESSIONS_H
#define AGENTHOST_HOST_SESSIONS_H

#include <jansson.h>
#include <stdbool.h>

#include "host.h"
#include "store.h"

typedef struct ah_sessions ah_sessions;

typedef struct ah_sessions_opts {
  ah_host *host;
  const ah_config *config; /* state_dir, default_provider, providers */
  ah_store_sync sync;      /* 0 = NORMAL */
  uint64_t lease_ttl_ms;   /* 0 = 30000 */
  int max_depth;           /* subagent depth limit; 0 = 3 */
  bool recover;            /* resume sessions left running or with queued prompts (the daemon) */
  bool lazy_store;         /* open the store at the first use instead of now (stdio children) */
} ah_sessions_opts;

/* Open the store at state_dir/agenthost.db and create the manager. Returns 0 or the store's error with
 * *why (corrupt database, newer schema…). */
int ah__sessions_new(const ah_sessions_opts *opts, ah_sessions **out, char **why);

/* Register session.* and request.* on the core mount (inside the core's mount phase). */
int ah__sessions_register(ah_sessions *s, ah_mount *core);

/* Start once the core is mounted: the lease renewal timer, and the recovery of sessions left running or
 * with queued prompts (when opts.recover). */
void ah__sessions_start(ah_sessions *s, ah_mount *core);

/* Stop admission, cancel running turns, settle every agent, release the leases, close the store; then
 * `cb`. After it, ah__sessions_free(). */
void ah__sessions_stop(ah_sessions *s, void (*cb)(void *arg), void *arg);
void ah__sessions_free(ah_sessions *s);

/* A plugin is being withdrawn (before its withdraw() runs): end every turn running on a provider it
 * registered, cancel and free those provider turns (provider.h "withdraw"). */
void ah__sessions_provider_withdrawn(ah_sessions *s, ah_mount *mount);

/* The remote gateway's session lookups (REMOTE-AGENT-RESOLVE): the live session, loaded with its lease
 * when cold (concurrent lookups of one id coalesce into one load). `cb` gets 0 and the session, or
 * AH_ENOENT (unknown), AH_ECLOSED (closed), AH_EAGENTBUSY (owned by another process), AH_ESTATE (stopping).
 * A caller that keeps the session past the callback's loop turn holds it (hold / release). */
typedef void (*ah__session_fn)(int status, ah_session *s, void *arg);
void ah__sessions_lookup(ah_sessions *m, const char *id, ah__session_fn cb, void *arg);
void ah__session_hold(ah_session *s);
void ah__session_release(ah_session *s);
const char *ah__session_id(const ah_session *s);
json_t *ah__session_info(ah_session *s);
int ah__session_update(ah_session *s, const json_t *fields);

/* For tests and benchmarks. */
ah_store *ah__sessions_store(ah_sessions *s);
size_t ah__sessions_live(ah_sessions *s);
size_t ah__sessions_loads(ah_sessions *s);   /* cold resumes performed (coalesced ones count once) */
size_t ah__sessions_unloads(ah_sessions *s); /* idle sessions that left memory ([host] idle_unload_s) */
/* Unload now every live session idle for `idle_ms` or longer (UINT64_MAX: none); the number unloaded. The
 * sweep [host] idle_unload_s runs on a timer, callable at once by tests. */
size_t ah__sessions_idle_sweep(ah_sessions *s, uint64_t idle_ms);
/* The idle time after which a session leaves memory (ms; UINT64_MAX: never). */
uint64_t ah__sessions_idle_ms(ah_sessions *s);
const char *ah__sessions_owner(ah_sessions *s);
/* The store's health as host.describe shows it: {"health": "ok"|"full"|"damaged", "detail"?}; NULL while a
 * lazily opened store was not opened yet. */
json_t *ah__sessions_store_health(ah_sessions *s);
/* The same as a number, cheaply: -1 (not opened yet), AH_STORE_OK, AH_STORE_FULL or AH_STORE_DAMAGED. */
int ah__sessions_store_state(ah_sessions *s);

#endif
