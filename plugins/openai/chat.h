/* agenthost openai plugin — the Chat Completions wire: the messages of a request built from the
 * session's history and the turn's own round trips, the request body, and the streamed chunks folded into
 * one round (text, reasoning, tool calls assembled by index, the finish reason, usage, the model). Pure:
 * no host, no loop. */
#ifndef AGENTHOST_OPENAI_CHAT_H
#define AGENTHOST_OPENAI_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OA_MAX_CALLS 64

typedef struct oa_buf {
  char *p;
  size_t len, cap;
} oa_buf;

int oa_buf_add(oa_buf *b, const char *s, size_t n);
void oa_buf_free(oa_buf *b);

typedef struct oa_call {
  oa_buf id;
  oa_buf name;
  oa_buf args;
} oa_call;

/* One model round trip as it streamed. */
typedef struct oa_round {
  oa_buf text;
  oa_buf reasoning;
  oa_call calls[OA_MAX_CALLS];
  int ncalls;
  char finish[32]; /* "" until a choice finished */
  json_t *usage;   /* the last usage object the server sent */
  char model[128]; /* the model the server reported */
  bool done;       /* data: [DONE] */
  bool output;     /* any text, reasoning or tool call arrived */
} oa_round;

void oa_round_reset(oa_round *r);

/* Fold one chunk (a parsed `data:` value) into `r`. *text / *reasoning point into the chunk (borrowed)
 * when it carried a piece of either. 0, or -1 with `err` set: the chunk is an error object, or malformed
 * (not an object, a tool call index out of range). */
int oa_round_chunk(oa_round *r, const json_t *chunk, const char **text, const char **reasoning, char *err,
                   size_t cap);

/* The messages of the first request of a turn: the system prompt (may be NULL), the history entries
 * ({role: user, content} | {role: assistant, text} | {role: tool_call, …} | {role: tool_result, …}) and
 * the new user message's content blocks. A tool call whose result is missing is left out. New array. */
json_t *oa_messages(const char *system_prompt, const json_t *history, const json_t *content);

/* Text of user content blocks: text blocks joined with blank lines, a resource link as its name and URI. */
char *oa_content_text(const json_t *content);

/* The assistant message of a finished round with tool calls (content, tool_calls, and reasoning_content
 * when the server sent reasoning: DeepSeek requires it back within the turn). New reference. */
json_t *oa_assistant_message(const oa_round *r);

/* The tools of the turn as Chat Completions functions: [{name, description, params: {NAME: {type,
 * description, required}}}] → [{type: function, function: {name, description, parameters: JSON Schema}}]. */
json_t *oa_tools(const json_t *tools);

/* Drop the oldest whole exchanges (a user message and what followed it up to the next one) after the
 * system message until the estimated size fits `budget` tokens, never the last user message or anything
 * after it. Returns how many messages were dropped. */
int oa_fit(json_t *messages, const json_t *tools, int64_t budget);

/* A token estimate of a JSON value (its serialized length / 4). */
int64_t oa_estimate_tokens(const json_t *v);

#endif
