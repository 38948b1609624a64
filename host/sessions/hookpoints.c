/* The sessions' hook points (host/hooks.h): the document a hook sees, each run recorded as a `hook/ran`
 * event of the session, the chains a turn waits for (prompt_submit, before_tool, after_tool) and the ones
 * that only observe (turn_end, session_start, session_close), which keep the session in memory while they
 * run and are not cancelled with a turn.
 */
#include <stdlib.h>
#include <string.h>

#include "../hooks.h"
#include "session.h"

json_t *ah__hook_doc(session *s, const turn *t) {
  const char *prov = str(s->row, "provider");
  return json_pack("{s:s, s:s*, s:s*, s:s, s:s*}", "sessionId", s->id, "turnId", t ? t->id : NULL, "cwd",
                   str(s->row, "cwd"), "provider", prov ? prov : "echo", "model", str(s->row, "model"));
}

/* ---- chains a turn waits for ------------------------------------------------------------------------- */

typedef struct turn_chain {
  turn *t;
  char *tool;
  char *call_id;
  ah_turn_hooks_fn fn;
  void *arg;
} turn_chain;

static void turn_recorded(json_t *run, void *arg) {
  turn_chain *tc = arg;
  turn *t = tc->t;
  if (tc->tool) {
    json_object_set_new(run, "tool", json_string(tc->tool));
    json_object_set_new(run, "callId", json_string(tc->call_id));
  }
  if (!t->ended)
    ah__write_event(t->s, "hook/ran", t->id, NULL, run);
  else
    json_decref(run);
}

static void turn_chain_done(const ah_hook_verdict *v, void *arg) {
  turn_chain *tc = arg;
  turn *t = tc->t;
  t->tools_running--;
  tc->fn(t, v, tc->arg);
  free(tc->tool);
  free(tc->call_id);
  free(tc);
}

int ah__turn_hooks(turn *t, const char *point, const char *tool, const char *call_id, json_t *doc,
                   ah_turn_hooks_fn fn, void *arg) {
  ah_host *h = t->m->host;
  if (!ah__hooks_any(h, point, tool)) {
    json_decref(doc);
    return 0;
  }
  turn_chain *tc = calloc(1, sizeof *tc);
  if (!tc || (tool && !(tc->tool = strdup(tool))) || (call_id && !(tc->call_id = strdup(call_id)))) {
    if (tc)
      free(tc->tool);
    free(tc);
    json_decref(doc);
    return AH_ENOMEM;
  }
  tc->t = t;
  tc->fn = fn;
  tc->arg = arg;
  /* Counted like a running tool: an end meanwhile waits for the chain, so turn/ended stays last. */
  t->tools_running++;
  int rc = ah__hooks_run(h, point, tool, doc, str(t->s->row, "cwd"), t->cancel, turn_recorded,
                         turn_chain_done, tc);
  json_decref(doc);
  if (rc) {
    t->tools_running--;
    free(tc->tool);
    free(tc->call_id);
    free(tc);
    return rc;
  }
  return 1;
}

/* ---- chains that observe ----------------------------------------------------------------------------- */

typedef struct session_chain {
  session *s;
  void (*then)(session *s, void *arg);
  void *arg;
} session_chain;

static void session_recorded(json_t *run, void *arg) {
  session_chain *sc = arg;
  session *s = sc->s;
  if (!s->disposed && !s->lost && !s->broken)
    ah__write_event(s, "hook/ran", NULL, NULL, run);
  else
    json_decref(run);
}

static void session_chain_done(const ah_hook_verdict *v, void *arg) {
  (void)v; /* these points only observe */
  session_chain *sc = arg;
  session *s = sc->s;
  s->holds--;
  if (sc->then)
    sc->then(s, sc->arg);
  free(sc);
  ah__live_free_if_unused(s);
}

int ah__session_hooks(session *s, const char *point, json_t *doc, void (*then)(session *s, void *arg),
                      void *arg) {
  ah_host *h = s->m->host;
  if (!ah__hooks_any(h, point, NULL)) {
    json_decref(doc);
    return 0;
  }
  session_chain *sc = calloc(1, sizeof *sc);
  if (!sc) {
    json_decref(doc);
    return AH_ENOMEM;
  }
  sc->s = s;
  sc->then = then;
  sc->arg = arg;
  s->holds++; /* the session stays in memory until the chain ended */
  int rc =
      ah__hooks_run(h, point, NULL, doc, str(s->row, "cwd"), NULL, session_recorded, session_chain_done, sc);
  json_decref(doc);
  if (rc) {
    s->holds--;
    free(sc);
    return rc;
  }
  return 1;
}
