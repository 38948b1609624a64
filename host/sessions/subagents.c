/* Subagents: a child session started by a turn (depth-limited), its prompt, and the parent turn told
 * when the child's turn ended.
 */
#include <stdlib.h>
#include <string.h>

#include "session.h"

typedef struct child_start {
  turn *t;
  char *prompt;
} child_start;

static void child_prompt_written(session *child, int status, const json_t *event, void *arg) {
  (void)event;
  (void)arg;
  if (status == 0)
    ah__turn_claim(child);
}

static void child_created(int status, session *child, void *arg) {
  child_start *c = arg;
  turn *t = c->t;
  if (status || t->ended || t->cancelled) {
    if (!t->ended && t->pt)
      t->prov->turn_subagent_result(t->pt, NULL, t->cancelled ? "cancelled" : "error");
    if (t->child == child)
      t->child = NULL;
    free(c->prompt);
    free(c);
    return;
  }
  ah__write_event(t->s, "subagent/started", t->id, NULL,
                  json_pack("{s:s, s:s, s:b}", "sessionId", child->id, "prompt", c->prompt, "local", 1));
  ah__sm_emit(t->s->m, "subagent.started",
              json_pack("{s:s, s:s, s:b}", "parentSessionId", t->s->id, "sessionId", child->id, "local", 1));
  char mid[37];
  ah__live_enqueue(child, json_pack("[{s:s, s:s}]", "type", "text", "text", c->prompt), child_prompt_written,
                   NULL, mid);
  child->parent_message = strdup(mid);
  free(c->prompt);
  free(c);
}

session *ah__subagent_start(session *parent, turn *t, const char *prompt, int *rc) {
  ah_sessions *m = parent->m;
  int depth = (int)json_integer_value(json_object_get(parent->row, "depth")) + 1;
  if (depth > m->max_depth) {
    *rc = AH_E2BIG;
    return NULL;
  }
  child_start *c = calloc(1, sizeof *c);
  if (!c) {
    *rc = AH_ENOMEM;
    return NULL;
  }
  c->t = t;
  c->prompt = strdup(prompt);
  const char *title = "subagent";
  *rc = ah__live_create(m, str(parent->row, "cwd"), str(parent->row, "provider"), str(parent->row, "model"),
                        title, parent->id, true, depth, child_created, c);
  if (*rc) {
    free(c->prompt);
    free(c);
    return NULL;
  }
  session *child = AH__CONTAINER(m->sessions.prev, session, link); /* ah__live_create appends it */
  child->parent_turn = t;
  t->child = child;
  return child;
}

void ah__subagent_notify_parent(session *child, const char *message_id, const char *reason,
                                const char *text) {
  (void)message_id;
  turn *t = child->parent_turn;
  child->parent_turn = NULL;
  if (!t || t->child != child)
    return;
  t->child = NULL;
  ah__write_event(
      t->s, "subagent/finished", t->id, NULL,
      json_pack("{s:s, s:s, s:s}", "sessionId", child->id, "reason", reason, "text", text ? text : ""));
  ah__sm_emit(t->s->m, "subagent.finished",
              json_pack("{s:s, s:s, s:b, s:s}", "parentSessionId", t->s->id, "sessionId", child->id, "local",
                        1, "reason", reason));
  if (!t->ended && t->pt)
    t->prov->turn_subagent_result(t->pt, text, reason);
}
