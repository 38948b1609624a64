/* agenthost — the built-in tools an agent may use (internal).
 *
 * read_file {path}, write_file {path, content}, list_dir {path}, run_command {command, timeout_ms?},
 * update_plan {entries}
 * (DECISIONS.md "Tools"). Paths are relative to the session cwd (or absolute inside it) and confined to it:
 * no escape through "..", absolute paths elsewhere, or symlinks (resolved beneath the cwd with openat2
 * RESOLVE_BENEATH). File work runs on the thread pool; run_command runs `/bin/sh -c command` in the
 * session cwd through the host's process service (environment allowlist + nothing else, its own process
 * group), with an output cap, a timeout, and cancellation that kills the whole group (SIGTERM, SIGKILL
 * after a grace period) and reports only after the exit was observed.
 *
 * Policies (per session and tool): "allow" | "ask" | "deny"; defaults: allow for read_file and list_dir,
 * ask for write_file and run_command. The agent applies them; this unit only runs tools.
 *
 * Results (JSON objects):
 *   read_file   {content, bytes, truncated}          (UTF-8 text; at most AH_TOOL_MAX_READ bytes)
 *   write_file  {path, bytes}                         (creates or truncates; parent directories must exist)
 *   list_dir    {entries: [{name, type: "file"|"dir"|"symlink"|"other", size}]}  sorted by name
 *   run_command {exitCode, signal, stdout, stderr, truncated, timedOut, cancelled}
 *   update_plan {steps}  ({entries: [{content, status: pending|in_progress|completed, priority?}]}: the
 *                         plan is the call itself, which the sessions record as plan/updated)
 * Errors: is_error = true and {error: message} (a path outside the cwd, a missing file, bad arguments…).
 */
#ifndef AGENTHOST_HOST_TOOLS_H
#define AGENTHOST_HOST_TOOLS_H

#include <jansson.h>
#include <stdbool.h>

#include "host.h"

#define AH_TOOL_MAX_READ (1024 * 1024)
#define AH_TOOL_MAX_OUTPUT (256 * 1024) /* per stream of run_command */
#define AH_TOOL_DEFAULT_TIMEOUT_MS 60000
#define AH_TOOL_MAX_TIMEOUT_MS 600000
#define AH_TOOL_KILL_GRACE_MS 2000
/* write_file's result carries the file's text before the write under this key (JSON null for a new file;
 * absent when it was not UTF-8 text of at most AH_TOOL_MAX_READ bytes): the sessions take it out, store it
 * beside the result as `oldText` (for a client's diff) and never hand it to the model. */
#define AH_TOOL_PREVIOUS "_previous"

/* [{name, description, params: {NAME: {type, description, required}}, kind}] for the built-in tools. New
 * reference. */
json_t *ah__tools_describe(void);

/* What a tool does, as every listing says it (`kind`): read | edit | delete | move | search | execute |
 * think | fetch | other — the built-ins' own (read_file, list_dir: read; write_file: edit; run_command:
 * execute; update_plan: think), what a tool source lists (an MCP server's annotations), else other. The
 * session's mode decides by it (docs/sessions.md "Modes"); ACP clients show it. */
bool ah__tool_kind_valid(const char *kind);

/* A tool's name: [A-Za-z0-9_-]{1,64} (a plugin's, or what a tool source lists). */
bool ah__tool_name_valid(const char *name);

/* True for the name of a built-in tool. */
bool ah__tool_builtin(const char *name);

/* The tools a session sees: the built-ins, then the plugins' tools (ABI 1.5 register_tool) sorted by name,
 * each {name, description, params, kind} (built-ins) or {name, description, schema, kind} (a plugin's JSON
 * Schema; kind other).
 * New reference. */
json_t *ah__tools_list(ah_host *h);
/* A built-in tool, an active plugin's tool, or a name under an active tool source's prefix (which may not
 * be listed yet: a policy can name it before its server started). */
bool ah__tool_exists(ah_host *h, const char *name);
/* A tool's default policy (static storage): the built-in's ("allow" or "ask"), "ask" for a plugin's or a
 * source's tool; NULL for an unknown tool. `h` may be NULL: the built-ins only (also for ah__tool_exists). */
const char *ah__tool_policy(ah_host *h, const char *name);
/* The tool source (ABI 1.6) whose prefix begins `name` (active; with staged_too also one being mounted). */
struct ah__entry *ah__tool_source_of(ah_host *h, const char *name, bool staged_too);

/* The tools a session sees now (`tools` borrowed for the call): ah__tools_list's, then what every active
 * tool source lists for the session ({name, description, schema, group?, kind}); `notices` [string] says
 * which source was left out and why (an error of its list call). */
typedef void (*ah_tools_fn)(const json_t *tools, const json_t *notices, void *arg);
/* Asks every source (calls cancelled with `cancel`, may be NULL). Returns 0 and `cb` runs exactly once —
 * at once when no source is active or every source answered at once — or AH_EINVAL / AH_ENOMEM. */
int ah__tools_gather(ah_host *h, const char *session_id, const char *cwd, ah_cancel *cancel, ah_tools_fn cb,
                     void *arg);

/* `result` is borrowed for the call. */
typedef void (*ah_tool_done_fn)(const json_t *result, bool is_error, void *arg);
/* A plugin's tool reported progress {progress, total?, message?} (borrowed). */
typedef void (*ah_tool_progress_fn)(const json_t *progress, void *arg);

/* Run tool `name` with `args` (borrowed for the call) in `cwd` (absolute): a built-in, or a plugin's tool
 * (a call of its handler, under the call machinery: counted on its mount, answered `cancelled` when the
 * plugin is withdrawn). `cancel` (may be NULL): when it trips, the tool stops (run_command: the group is
 * killed; a plugin's tool: its call's token trips) and reports {cancelled: true} / an error.
 * Returns 0 and `cb` runs exactly once on a later loop turn; or AH_EINVAL (unknown tool, bad arguments —
 * `cb` not called) / AH_ENOMEM. */
int ah__tool_run(ah_host *h, const char *cwd, const char *name, const json_t *args, ah_cancel *cancel,
                 ah_tool_done_fn cb, void *arg);
/* The same for a session (a plugin's tool gets its id in params.sessionId), also for a tool source's tool;
 * `progress` (may be NULL) gets what a plugin's tool reports with call_progress. */
int ah__tool_run_in(ah_host *h, const char *session_id, const char *cwd, const char *name, const json_t *args,
                    ah_cancel *cancel, ah_tool_progress_fn progress, ah_tool_done_fn cb, void *arg);

/* The session's editor (docs/sessions.md "The editor's files"): methods of the surface that speaks for a
 * client able to read and write its own buffers — read {sessionId, path} → {content}, write {sessionId,
 * path, content} → anything. read_file and write_file of that session go through them once the path was
 * confined exactly as for the disk (beneath the cwd, no symlink out, never the host's own files); an error
 * of the method is the tool's error. Each may be NULL (that tool uses the disk, or runs the command here). */
typedef struct ah__tool_editor {
  const char *read;
  const char *write;
  /* run {sessionId, turnId, callId, command, cwd, timeoutMs} → {exitCode, signal, output, truncated,
   * timedOut, terminalId?}: run_command in the client's terminal (cancellable: the turn's cancel trips
   * the call, and the surface kills the command). */
  const char *run;
  const char *turn_id, *call_id; /* the call, for the surface to show it */
} ah__tool_editor;
int ah__tool_run_edited(ah_host *h, const char *session_id, const char *cwd, const char *name,
                        const json_t *args, const ah__tool_editor *editor, ah_cancel *cancel,
                        ah_tool_progress_fn progress, ah_tool_done_fn cb, void *arg);

/* Resolve `path` beneath `cwd` for a tool: returns a malloc'ed absolute path inside cwd, or NULL with
 * *why (static string) when it escapes or is invalid. Lexical check only (symlinks are refused at open
 * time by RESOLVE_BENEATH); exposed for tests. */
char *ah__tool_confine(const char *cwd, const char *path, const char **why);

#endif
