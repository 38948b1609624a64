/* agenthost — the model provider interface: what runs one turn of an agent.
 *
 * The agent (the host's sessions engine, host/sessions/) owns the conversation, the tools and the durable
 * events; a provider only produces the assistant's side of one turn. The agent starts a turn with the
 * conversation so far, the new user message and the tools the agent offers; the provider reports through
 * the sink:
 *   delta(text)              transient streamed text (never stored)
 *   commit(text)             a committed assistant message (stored as message/committed);
 *                            commit_json(text) the same for a JSON string, without a copy (ABI 1.2)
 *   tool_call(id, name, args) the model wants a tool run; the agent applies the session's policy, runs it
 *                            (or asks, or refuses) and answers with turn_tool_result()
 *   ask(question, options)   the model asks the user a question; answered with turn_answer()
 *   subagent(prompt)         start a child session with `prompt`; its final text comes back through
 *                            turn_subagent_result()
 *   usage(round)             one model round trip's usage (ABI 1.8), stored as a model/usage event
 *   end(reason, usage, error) the turn is over: reason end | max-tokens | cancelled | error | refusal;
 *                            `error` (may be NULL) explains an error; `usage` {inputTokens, outputTokens,
 *                            and optionally cachedInputTokens, reasoningTokens, requests, model}
 * The sink must be called on the loop thread. After end() the provider makes no more sink calls. The
 * agent calls turn_free() after end() (and only then); turn_cancel() asks for an early end, which the
 * provider reports with end("cancelled", ...) — once, possibly after pending work was stopped.
 *
 * Strings passed to the sink are borrowed for the call; JSON arguments are borrowed for the call.
 *
 * A plugin provides a provider type with ah_host_api.register_provider(). When the plugin is withdrawn
 * while a turn runs on it, the host calls turn_cancel() and then turn_free() without waiting for end():
 * the provider stops at once (it may finish reclaiming resources later, before its withdraw completes) and
 * makes no further sink calls; the host records the turn as ended with an error.
 */
#ifndef AGENTHOST_PROVIDER_H
#define AGENTHOST_PROVIDER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct ah_provider ah_provider;
typedef struct ah_provider_turn ah_provider_turn;
typedef struct ah_mount ah_mount;

typedef struct ah_turn_sink {
  uint32_t struct_size;
  void (*delta)(void *ctx, const char *text);
  void (*commit)(void *ctx, const char *text);
  void (*tool_call)(void *ctx, const char *call_id, const char *name, const json_t *args);
  void (*ask)(void *ctx, const char *question, const json_t *options);
  void (*subagent)(void *ctx, const char *prompt);
  void (*end)(void *ctx, const char *reason, const json_t *usage, const char *error);
  /* The conversation before this turn: [{role: "user", content: [blocks]} | {role: "assistant", text}],
   * oldest first, bounded. Read from the store on the first call only (a provider that needs no history,
   * like echo, costs nothing); borrowed, valid until end(). Unlike the other entries it may be called from
   * inside turn_start. */
  const json_t *(*history)(void *ctx);
  void *reserved[3];
  /* ABI 1.2 (check with AH_HAS): commit(json_string_value(text)) without the copy — `text` is a JSON
   * string whose reference the sink takes. For a provider that built a long text (off the loop, say):
   * commit() must copy a borrowed C string on the loop thread. */
  void (*commit_json)(void *ctx, json_t *text);
  /* ABI 1.4 (check with AH_HAS). reasoning: the model's visible reasoning as it streams — transient
   * like delta (never stored, never part of the answer), published as session.reasoning. notice: a
   * durable note on the turn, stored as a turn/notice event, e.g. {kind: "retry", message, attempt,
   * attempts, waitMs} before a retry wait or {kind: "history-cut", dropped} when the history was cut to
   * fit the context window (borrowed for the call). */
  void (*reasoning)(void *ctx, const char *text);
  void (*notice)(void *ctx, const json_t *note);
  /* ABI 1.8 (check with AH_HAS). usage: one model round trip's usage as its server reported it,
   * {inputTokens, outputTokens, cachedInputTokens?, reasoningTokens?, model?} (whole numbers; `model` the
   * model the server says it used; borrowed), once per round trip as soon as it is known, before end().
   * Stored at once as a model/usage event, so a turn cut short still counts what it spent. A provider
   * that reports round trips gives end() their sum as before: the host then counts the round trips, never
   * both. */
  void (*usage)(void *ctx, const json_t *round);
} ah_turn_sink;

typedef struct ah_turn_input {
  uint32_t struct_size;
  const char *session_id;
  const char *cwd;
  const char *model;     /* may be NULL: the provider's default */
  const json_t *content; /* the new user message: [{type: "text", text} | {type: "resource_link", ...}] */
  const json_t *tools;   /* [{name, description, params}] the agent offers */
  int64_t max_tokens;    /* 0 = the provider's default */
  int depth;             /* 0 for a root session; subagents are deeper */
  void *reserved[4];
  /* ABI 1.1 (check with AH_HAS). */
  const char *provider_name; /* the configured [provider.NAME] the session uses */
  const json_t
      *provider_config; /* its keys as strings, "type" included (borrowed for the call; never NULL) */
} ah_turn_input;

struct ah_provider {
  uint32_t struct_size;
  const char *name; /* "echo", "openai", "acp", or a configured [provider.NAME] */
  /* Start a turn. Returns 0 and sets *out, after which the sink is called (never from inside this call);
   * or a negative AH_E* code (then nothing is called). */
  int (*turn_start)(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                    ah_provider_turn **out);
  void (*turn_tool_result)(ah_provider_turn *t, const char *call_id, const json_t *result, bool is_error);
  void (*turn_answer)(ah_provider_turn *t, const json_t *answer, bool cancelled);
  void (*turn_subagent_result)(ah_provider_turn *t, const char *final_text, const char *reason);
  void (*turn_cancel)(ah_provider_turn *t);
  void (*turn_free)(ah_provider_turn *t);
  void *data;
  void *reserved[8];
  /* ABI 1.4: AH_PROVIDER_* flags (0 = none). */
  uint32_t flags;
  /* ABI 1.4, optional (check with AH_HAS): the models the server of the configured provider `name`
   * (its section `config`, borrowed for the call) offers. done(arg, 0, models, NULL) with
   * [{id, ownedBy?}] or done(arg, AH_E*, NULL, message), exactly once, on the loop thread, never inside
   * this call — also when the plugin is withdrawn meanwhile (then AH_ECANCELED). Returns 0, or a negative
   * AH_E* (then done is never called). */
  int (*list_models)(ah_provider *p, const char *name, const json_t *config,
                     void (*done)(void *arg, int status, const json_t *models, const char *message),
                     void *arg);
};

/* The provider reads tool calls and their results in history(): besides the user and assistant entries,
 * {role: "tool_call", callId, name, args} and {role: "tool_result", callId, name, result, isError}, in
 * the order they happened (a call whose result was never recorded is left out with it). Without the
 * flag, history() has only the user and assistant entries (as before 1.4). */
#define AH_PROVIDER_TOOL_HISTORY (1u << 0)

#endif
