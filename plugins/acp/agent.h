/* agenthost — the agent side of the acp plugin (`agenthost acp`): ACP v1 on stdin/stdout, and the pure
 * conversions between ACP messages and the core's sessions and events (codec.c). Internal to the plugin. */
#ifndef AGENTHOST_ACP_AGENT_H
#define AGENTHOST_ACP_AGENT_H

#include <agenthost/plugin.h>
#include <stdbool.h>
#include <stddef.h>

/* ---- the stdio agent (agent.c) ---------------------------------------------------------------------- */

typedef struct acp_agent acp_agent;

/* Start serving ACP on the host's stdio: claim stdio, open the JSON-RPC peer, subscribe to the bus.
 * `config` is the [plugin.acp] object (borrowed; `stream_deltas`, `max_line` are read). Only inside mount().
 * Returns 0 or a negative AH_E* code (AH_ECONFIG for a bad key); on error nothing is left allocated. */
int acp_agent_start(ah_mount *m, const ah_host_api *api, const json_t *config, acp_agent **out);

/* Stop: answer every prompt still pending `cancelled`, close the peer, wait for the core calls in flight
 * (their tokens are tripped) and call `done(arg)` once on the loop thread, then free `a`. `done` may run
 * before this returns. */
void acp_agent_stop(acp_agent *a, void (*done)(void *arg), void *arg);

/* ---- codec (codec.c): no state, no I/O ---------------------------------------------------------------- */

/* Validate an ACP `prompt` (array of ContentBlock) and build the core's content blocks: `text` and
 * `resource_link` are accepted (ACP-CODEC: links are kept as resource_link blocks, which the providers
 * render as [name](uri)); `image`, `audio` and `resource` are refused since they are not advertised.
 * Returns the new array, or NULL with `why` filled (a message naming the field). */
json_t *acp_codec_prompt(const json_t *prompt, char *why, size_t why_len);

/* The ACP stop reason for a core turn-end reason (end, max-tokens, refusal, cancelled); NULL for `error`
 * and anything unknown, which the caller reports as a JSON-RPC error. */
const char *acp_codec_stop_reason(const char *reason);

/* Tool presentation: the ToolKind of a call (the kind the core recorded with it when it is one of ACP's, else
 * from the built-in tool's name), and a short human title (malloc'ed). */
const char *acp_codec_tool_kind(const char *tool, const char *recorded);
char *acp_codec_tool_title(const char *tool, const json_t *args);

/* The toolCallId of a core tool call: unique in the session (core call ids restart at call_1 per turn).
 * Writes into `buf`. */
void acp_codec_tool_call_id(char *buf, size_t n, const char *turn_id, const char *call_id);

/* What the codec keeps of one session's stream:
 * - per-turn message numbering: the messageId of agent_message_chunk updates is "<turnId>/<n>", n counting
 *   the turn's committed messages, so streamed deltas and the commit that ends them share one id;
 * - the session's cwd, which makes a tool's relative paths absolute (locations, diffs);
 * - the tool calls not finished yet (toolCallId → {name, args}), whose arguments the result's update
 *   needs (a write's new text for its diff).
 * Zero-initialised; acp_codec_state_clear frees it, acp_codec_state_move hands it on. */
typedef struct acp_codec_state {
  char turn[80];
  int n;
  char *cwd;     /* owned; NULL = unknown */
  json_t *calls; /* owned; NULL until the first tool call */
} acp_codec_state;

void acp_codec_state_clear(acp_codec_state *st);
/* `dst` cleared, then given what `src` holds; `src` is left zeroed. */
void acp_codec_state_move(acp_codec_state *dst, acp_codec_state *src);
/* Set the cwd (copied). */
void acp_codec_state_cwd(acp_codec_state *st, const char *cwd);

/* The current message id of `turn` in `ctr` (resetting it when the turn changed). */
void acp_codec_message_id(acp_codec_state *ctr, const char *turn_id, char *buf, size_t n);

/* A stored event as zero or more ACP SessionUpdate objects appended to `out` (a JSON array). In `replay`
 * mode `inbox/received` becomes user_message_chunk updates (live, the client sent the prompt itself).
 * `ctr` numbers the committed messages. `message/committed` is converted only when `with_commits`. */
void acp_codec_event(const json_t *event, bool replay, bool with_commits, acp_codec_state *ctr, json_t *out);

/* An output content block as an ACP ContentBlock: text and resource_link as they are, anything else
 * (an image, audio, a blob) as explicit placeholder text, e.g. "[image: image/png, not shown]". */
json_t *acp_codec_block_out(const json_t *block);

/* An agent_message_chunk update with text and messageId (may be NULL). */
json_t *acp_codec_text_chunk(const char *kind, const char *text, const char *message_id);

#endif
