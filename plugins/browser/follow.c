/* agenthost browser plugin — the sessions a web UI is looking at stay in the host's memory.
 *
 * The host unloads a session that has been idle for [host] idle_unload_s unless a surface follows it
 * (session.follow). The mux carries every session's events, so what a tab shows is not known from the
 * socket: a session counts as shown when a call about it (session.get, session.history, a prompt, …)
 * succeeded through this plugin while at least one mux socket is open. The BP_FOLLOW_MAX sessions used most
 * recently are followed; the least recently used one is let go when a new one comes, and every follow ends
 * when the last mux socket closes (or the plugin is withdrawn). A follow the host ends (the session was
 * closed, or no longer runs here) is forgotten; the next call about the session follows it again.
 */
#include <stdlib.h>
#include <string.h>
#define uthash_fatal(msg) abort()
#include <uthash.h>

#include "browser.h"

struct bp_follow {
  bp_state *st;
  char *id;
  ah_cancel *token; /* the session.follow call's: tripped to let go */
  bool held;        /* in st->follows (and the recency list) */
  bp_follow *newer, *older;
  UT_hash_handle hh;
};

static void lru_unlink(bp_state *st, bp_follow *f) {
  if (f->newer)
    f->newer->older = f->older;
  else
    st->follow_newest = f->older;
  if (f->older)
    f->older->newer = f->newer;
  else
    st->follow_oldest = f->newer;
  f->newer = f->older = NULL;
}

static void lru_push(bp_state *st, bp_follow *f) {
  f->older = st->follow_newest;
  f->newer = NULL;
  if (st->follow_newest)
    st->follow_newest->newer = f;
  st->follow_newest = f;
  if (!st->follow_oldest)
    st->follow_oldest = f;
}

/* Out of the table; the call, if it runs, is answered later and frees `f`. */
static void forget(bp_state *st, bp_follow *f) {
  if (!f->held)
    return;
  lru_unlink(st, f);
  HASH_DEL(st->follows, f);
  st->nfollows--;
  f->held = false;
}

static void follow_free(bp_follow *f) {
  if (f->token)
    f->st->api->token_free(f->token);
  free(f->id);
  free(f);
}

static void on_follow_ended(const ah_outcome *o, void *arg) {
  bp_follow *f = arg;
  bp_state *st = f->st;
  st->outstanding--;
  if (o->status && o->status != AH_ECANCELED && !st->withdrawing)
    st->api->log(st->m, AH_PLOG_DEBUG, "follow of %s ended: %s", f->id,
                 o->message ? o->message : ah_strerror(o->status));
  forget(st, f);
  follow_free(f);
}

static void let_go(bp_state *st, bp_follow *f) {
  forget(st, f);
  st->api->token_trip(f->token); /* answered `cancelled` on a later turn (on_follow_ended frees it) */
}

void bp_follow_touch(bp_state *st, const char *session_id) {
  if (st->withdrawing || st->nmux == 0 || !session_id || !*session_id)
    return;
  bp_follow *f = NULL;
  HASH_FIND_STR(st->follows, session_id, f);
  if (f) {
    lru_unlink(st, f);
    lru_push(st, f);
    return;
  }
  if (st->nfollows >= BP_FOLLOW_MAX)
    let_go(st, st->follow_oldest);
  f = calloc(1, sizeof *f);
  if (!f || !(f->id = strdup(session_id)) || st->api->token_new(st->m, NULL, &f->token) != 0) {
    if (f)
      follow_free(f);
    return;
  }
  f->st = st;
  /* In the table before the dispatch: the host may answer at once (out of memory), and that answer frees it.
   */
  HASH_ADD_KEYPTR(hh, st->follows, f->id, strlen(f->id), f);
  lru_push(st, f);
  st->nfollows++;
  f->held = true;
  st->outstanding++;
  ah_caller c;
  int rc = st->api->dispatch(st->m, bp_caller(&c, true, 0), "session.follow",
                             json_pack("{s:s}", "sessionId", f->id), f->token, on_follow_ended, f);
  if (rc) {
    st->outstanding--;
    st->api->log(st->m, AH_PLOG_DEBUG, "follow of %s: %s", f->id, ah_strerror(rc));
    forget(st, f);
    follow_free(f);
  }
}

void bp_follow_drop_all(bp_state *st) {
  while (st->follow_oldest)
    let_go(st, st->follow_oldest);
}
