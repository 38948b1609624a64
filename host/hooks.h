/* agenthost — hooks (internal): commands from the configuration ([hook.NAME]) and plugins' handlers
 * (ABI 1.7 register_hook) that observe, veto or amend what an agent does, at six points:
 *
 *   before_tool    before a tool runs (after the session's policy let it through, before an approval):
 *                  may deny with a reason (the model reads it as the tool's error) or replace the arguments
 *   after_tool     after a tool ran, before the model reads its result: may add a note for the model
 *   prompt_submit  when a turn takes its prompt, before the provider starts: may add context or refuse it
 *   turn_end       when a turn ended (observes)
 *   session_start  when a session was created (observes)
 *   session_close  when a session is closed, before the close is stored (observes)
 *
 * A hook sees a JSON document: {event, hook, sessionId, turnId?, cwd, provider, model?, tool?: {name,
 * callId, arguments, result?, isError?}, prompt?: {content, text}, turn?: {reason, error?}} and answers
 * allow, deny(reason) or amend: {decision?: "allow"|"deny", reason?, arguments? (before_tool), context? (a
 * string: prompt_submit, after_tool)}. A command hook gets the document on stdin: exit 0 = allow (stdout,
 * when not empty, is that JSON answer), exit 2 = deny with stderr as the reason, anything else — another
 * status, a signal, a timeout, stdout that is not such an answer — is an error that `on_error` turns into
 * deny or allow. A plugin hook answers its call with the JSON answer; a call error, a timeout or a withdraw
 * is an error the same way. Hooks on one point run one after another, the configuration's in file order, then
 * the plugins' in mount and registration order; the first deny ends the chain, and a later hook sees the
 * arguments an earlier one replaced. A cancelled chain (the turn's token) kills the running command.
 * `match` (tool events only) is a list of shell patterns (fnmatch) of tool names; none = every tool.
 */
#ifndef AGENTHOST_HOST_HOOKS_H
#define AGENTHOST_HOST_HOOKS_H

#include <jansson.h>
#include <stdbool.h>
#include <string.h>

#include "host.h"

#define AH_HOOK_POINTS_TEXT "before_tool, after_tool, prompt_submit, turn_end, session_start or session_close"
#define AH_HOOK_DEFAULT_TIMEOUT_MS 30000
#define AH_HOOK_MAX_TIMEOUT_MS 600000

static inline bool ah__hook_point_valid(const char *p) {
  static const char *const points[] = {"before_tool", "after_tool",    "prompt_submit",
                                       "turn_end",    "session_start", "session_close"};
  for (size_t i = 0; p && i < sizeof points / sizeof points[0]; i++)
    if (strcmp(p, points[i]) == 0)
      return true;
  return false;
}

/* What a chain decided: deny (by `hook`, with `reason`), or allow with what was amended. Borrowed for the
 * callback. */
typedef struct ah_hook_verdict {
  bool deny;
  bool cancelled;          /* the chain's token tripped: nothing more ran (deny is set too) */
  const char *hook;        /* the hook that denied */
  const char *reason;      /* its reason, or NULL */
  const char *error;       /* or its failure, which its on_error made a denial */
  const json_t *arguments; /* before_tool: the arguments to run with when a hook replaced them, else NULL */
  const json_t *context;   /* [string]: what the hooks added, in order (empty when none) */
} ah_hook_verdict;

typedef void (*ah_hooks_done_fn)(const ah_hook_verdict *v, void *arg);
/* A denial as the model or the user reads it: "denied by hook NAME: REASON", "denied by hook NAME" or
 * "hook NAME failed: ERROR". malloc'ed (NULL when out of memory). */
char *ah__hook_denial(const ah_hook_verdict *v);
/* One hook ran: {hook, event, source: "config"|"plugin", plugin?, outcome: "allow"|"amend"|"deny"|
 * "error"|"cancelled", durationMs, reason?, error?, onError?}; stolen. */
typedef void (*ah_hook_record_fn)(json_t *run, void *arg);

/* Whether any enabled hook is on `point` (for a tool event: one that matches `tool`). */
bool ah__hooks_any(ah_host *h, const char *point, const char *tool);

/* Run the chain of `point` for `doc` (borrowed; its `event` and `hook` are set per hook on a copy).
 * `cwd` is where a command hook without its own cwd runs. `cancel` (may be NULL) stops the chain: the
 * running command is killed, a plugin's call cancelled. `record` (may be NULL) is told of each run as it
 * ends. Returns 0 and `done` runs exactly once on a later loop turn, or AH_ENOMEM. */
int ah__hooks_run(ah_host *h, const char *point, const char *tool, const json_t *doc, const char *cwd,
                  ah_cancel *cancel, ah_hook_record_fn record, ah_hooks_done_fn done, void *arg);

/* Every hook, in the order they run: [{name, event, source, plugin?, match, timeoutMs, onError, enabled,
 * command?}] — a command hook's program but not its args or env (they may carry secrets). New reference. */
json_t *ah__hooks_describe(ah_host *h);
/* The same for the hooks of a configuration alone (ah_config.hooks). */
json_t *ah__hooks_describe_config(const json_t *hooks);

#endif
