/* agenthost — the embedded default provider "echo" (see echo.h for what it does and its directives).
 *
 * A turn is compiled once, in turn_start(), into a list of steps (the directives that wait or talk to the
 * sink) plus the echo text and its modifiers (/chunks, /max-tokens, /refuse). It then runs as a small
 * state machine driven by two handles: every tick makes at most one sink call and then either arms the
 * next tick (an idle handle for "the next step": once per loop iteration, so a long stream of deltas
 * interleaves with everyone's I/O — libuv runs a zero-delay timer re-armed from its own callback again in
 * the same pass — and a timer for /sleep MS), waits for the agent's answer
 * (turn_tool_result, turn_answer, turn_subagent_result) or ends the turn. Answers and turn_cancel() never
 * call the sink themselves; they record what happened and arm the timer, so the sink is never re-entered
 * from a call the agent makes into the provider.
 *
 * The turn owns both handles, which are embedded in it: turn_free() closes them and the memory is freed in
 * the last close callback, so a timer callback that called end() (after which the agent may free the turn at
 * once) can still read the turn's flags safely until it returns.
 */
#include "echo.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agenthost/errors.h"
#include "agenthost/plugin.h"
#include "log.h"

#define ECHO_SLEEP_MAX_MS 3600000u
#define ECHO_CHUNKS_MAX 1000u
#define ECHO_ERR_MAX 512
/* No delta is longer than this: a large echo streams in as many deltas as it takes, so no single sink call
 * (and no frame a surface writes for it) copies more than this much on the loop. */
#define ECHO_DELTA_MAX 65536u
/* A prompt at least this long is compiled on the thread pool; a shorter one at once (the pool's round trip
 * costs more than compiling it). */
#define ECHO_OFF_LOOP_BYTES ((size_t)256 * 1024)

typedef enum echo_step_kind {
  ECHO_STEP_INVALID = 0,
  ECHO_STEP_SLEEP,
  ECHO_STEP_FAIL,
  ECHO_STEP_TOOL,
  ECHO_STEP_ASK,
  ECHO_STEP_SUBAGENT,
  ECHO_STEP_HISTORY,
} echo_step_kind;

typedef struct echo_step {
  echo_step_kind kind;
  uint64_t ms;  /* /sleep */
  char *text;   /* /fail message, /tool name, /ask question, /subagent prompt (owned) */
  json_t *args; /* /tool arguments (owned) */
} echo_step;

typedef enum echo_phase {
  ECHO_PHASE_INVALID = 0,
  ECHO_PHASE_STEPS,  /* running the steps in order */
  ECHO_PHASE_WAIT,   /* a tool result, an answer or a subagent's result is due */
  ECHO_PHASE_DELTAS, /* streaming the echo */
  ECHO_PHASE_COMMIT, /* committing the echo */
  ECHO_PHASE_END,    /* end() on the next tick */
  ECHO_PHASE_DONE,   /* end() was called: no more sink calls */
} echo_phase;

typedef struct echo_state {
  uv_loop_t *loop;
} echo_state;

struct ah_provider_turn {
  uv_timer_t timer;  /* /sleep */
  uv_idle_t next;    /* the next tick, on the next loop iteration */
  int open_handles;  /* the last close callback frees the turn */
  ah_turn_sink sink; /* copied: the agent's sink need not outlive turn_start() */
  void *ctx;
  echo_phase phase;
  bool cancel_requested;
  bool freed;
  bool oom; /* an allocation failed while running: end "error" */

  echo_step *steps;
  size_t nsteps;
  size_t next_step;
  echo_step_kind waiting; /* what ECHO_PHASE_WAIT waits for */
  char call_id[32];
  unsigned calls;
  char *pending_commit; /* a directive's result, committed on the next tick (owned) */

  /* A large prompt is compiled on the loop's thread pool (nothing on the loop copies or scans it): from
   * turn_start() until the work's completion the turn only records cancel and free. */
  uv_work_t work;
  bool compiling;
  json_t *content; /* the prompt's content blocks while compiling (a reference) */

  /* While compiling only: the echo's text (the non-directive lines), a span of the prompt or of text_own. */
  const char *text;
  size_t text_n;  /* its length (kept) */
  char *text_own; /* the text when it is not one span of the prompt (owned) */
  char *prompt;   /* the concatenated blocks, when there are several (owned) */
  json_t *echo;   /* "echo: <text>", built while compiling (a reference) */
  size_t *cuts;   /* byte offsets of the /chunks boundaries in `echo`, ndeltas + 1 of them (owned) */
  size_t ndeltas;
  size_t next_delta;
  size_t pos;  /* the next delta starts here (within the current /chunks piece) */
  char *piece; /* a delta's bytes, at most ECHO_DELTA_MAX (owned) */
  unsigned chunks;
  bool max_tokens;
  bool refuse;
  char *error; /* a malformed directive: the turn ends "error" with this on its first tick (owned) */

  size_t input_bytes;
  size_t output_bytes;
  bool committed;
};

/* ---- a growable byte buffer ---------------------------------------------------------------------------- */

typedef struct echo_buf {
  char *data;
  size_t len;
  size_t cap;
  bool failed;
} echo_buf;

static void echo_buf_add(echo_buf *b, const char *s, size_t n) {
  if (b->failed)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
      b->failed = true;
      return;
    }
    b->data = d;
    b->cap = cap;
  }
  if (n)
    memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void echo_buf_str(echo_buf *b, const char *s) {
  echo_buf_add(b, s, strlen(s));
}

/* The buffer's string (an empty string for an empty buffer), or NULL when an allocation failed. */
static char *echo_buf_take(echo_buf *b) {
  if (!b->failed && !b->data)
    echo_buf_add(b, "", 0);
  if (b->failed) {
    free(b->data);
    b->data = NULL;
    return NULL;
  }
  char *s = b->data;
  b->data = NULL;
  return s;
}

/* ---- parsing the prompt -------------------------------------------------------------------------------- */

static bool echo_is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static bool echo_blank(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!echo_is_space(s[i]))
      return false;
  return true;
}

/* Strict decimal: digits only, no sign, no spaces, at most `max`. */
static bool echo_parse_uint(const char *s, size_t n, uint64_t max, uint64_t *out) {
  if (n == 0 || n > 10)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v > max)
    return false;
  *out = v;
  return true;
}

static char *echo_strndup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* Record the first malformed directive ("line N: " and the formatted message). Returns false so that
 * callers can `return echo_fail_parse(...)`. */
static bool echo_fail_parse(ah_provider_turn *t, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool echo_fail_parse(ah_provider_turn *t, size_t line, const char *fmt, ...) {
  if (t->error)
    return false;
  char msg[ECHO_ERR_MAX];
  int n = snprintf(msg, sizeof msg, "line %zu: ", line);
  if (n < 0 || (size_t)n >= sizeof msg)
    n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  t->error = strdup(msg);
  if (!t->error)
    t->oom = true;
  return false;
}

static bool echo_add_step(ah_provider_turn *t, echo_step step) {
  echo_step *s = realloc(t->steps, (t->nsteps + 1) * sizeof *s);
  if (!s) {
    free(step.text);
    json_decref(step.args);
    t->oom = true;
    return false;
  }
  t->steps = s;
  t->steps[t->nsteps++] = step;
  return true;
}

/* Run one directive line (`name` is the directive without the slash, `arg` its trimmed argument).
 * Returns false when the turn cannot go on (malformed argument or no memory). */
static bool echo_directive(ah_provider_turn *t, size_t line, const char *name, const char *arg, size_t argn) {
  int an = (int)(argn > 200 ? 200 : argn); /* quoted arguments are shortened in messages */
  echo_step step = {.kind = ECHO_STEP_INVALID, .ms = 0, .text = NULL, .args = NULL};
  if (strcmp(name, "sleep") == 0) {
    uint64_t ms = 0;
    if (!echo_parse_uint(arg, argn, ECHO_SLEEP_MAX_MS, &ms))
      return echo_fail_parse(t, line, "/sleep needs milliseconds 0..3600000, got \"%.*s\"", an, arg);
    step.kind = ECHO_STEP_SLEEP;
    step.ms = ms;
  } else if (strcmp(name, "chunks") == 0) {
    uint64_t n = 0;
    if (!echo_parse_uint(arg, argn, ECHO_CHUNKS_MAX, &n) || n == 0)
      return echo_fail_parse(t, line, "/chunks needs a count 1..1000, got \"%.*s\"", an, arg);
    t->chunks = (unsigned)n;
    return true;
  } else if (strcmp(name, "max-tokens") == 0 || strcmp(name, "refuse") == 0) {
    if (argn)
      return echo_fail_parse(t, line, "/%s takes no argument, got \"%.*s\"", name, an, arg);
    if (name[0] == 'm')
      t->max_tokens = true;
    else
      t->refuse = true;
    return true;
  } else if (strcmp(name, "history") == 0) {
    if (argn)
      return echo_fail_parse(t, line, "/history takes no argument, got \"%.*s\"", an, arg);
    step.kind = ECHO_STEP_HISTORY;
    step.text = strdup("history");
  } else if (strcmp(name, "fail") == 0) {
    step.kind = ECHO_STEP_FAIL;
    step.text = argn ? echo_strndup(arg, argn) : strdup("failed");
  } else if (strcmp(name, "ask") == 0 || strcmp(name, "subagent") == 0) {
    if (!argn)
      return echo_fail_parse(t, line, "/%s needs %s", name, name[0] == 'a' ? "a question" : "a prompt");
    step.kind = name[0] == 'a' ? ECHO_STEP_ASK : ECHO_STEP_SUBAGENT;
    step.text = echo_strndup(arg, argn);
  } else if (strcmp(name, "tool") == 0) {
    size_t nn = 0;
    while (nn < argn && !echo_is_space(arg[nn]))
      nn++;
    if (nn == 0)
      return echo_fail_parse(t, line, "/tool needs a tool name and optional JSON arguments");
    const char *js = arg + nn;
    size_t jn = argn - nn;
    while (jn && echo_is_space(*js)) {
      js++;
      jn--;
    }
    json_t *args = NULL;
    if (jn == 0) {
      args = json_object();
    } else {
      json_error_t err;
      args = json_loadb(js, jn, JSON_REJECT_DUPLICATES, &err);
      if (!args || !json_is_object(args)) {
        bool parsed = args != NULL;
        json_decref(args);
        return echo_fail_parse(t, line, "/tool %.*s: the arguments must be a JSON object (%s)",
                               (int)(nn > 100 ? 100 : nn), arg, parsed ? "got another JSON value" : err.text);
      }
    }
    step.kind = ECHO_STEP_TOOL;
    step.text = echo_strndup(arg, nn);
    step.args = args;
  } else {
    return true; /* not reached: the caller only passes known directives */
  }
  if (!step.text && step.kind != ECHO_STEP_SLEEP) {
    json_decref(step.args);
    t->oom = true;
    return false;
  }
  return echo_add_step(t, step);
}

static bool echo_known_directive(const char *s, size_t n) {
  static const char *const names[] = {"sleep",  "fail",       "tool",   "ask",    "subagent",
                                      "chunks", "max-tokens", "refuse", "history"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
      return true;
  return false;
}

typedef struct echo_span {
  const char *p;
  size_t n;
} echo_span;

/* Split the `len` bytes at `prompt` into directives (compiled into steps and modifiers) and the echo text:
 * the other lines joined with "\n", without leading and trailing blank lines — a span of `prompt` when those
 * lines follow each other there (no copy), else a new string. Returns false when the turn cannot run. */
static bool echo_parse(ah_provider_turn *t, const char *prompt, size_t len) {
  size_t cap = 1;
  for (const char *c = prompt, *end = prompt + len; (c = memchr(c, '\n', (size_t)(end - c))) != NULL; c++)
    cap++;
  echo_span *lines = calloc(cap, sizeof *lines);
  if (!lines) {
    t->oom = true;
    return false;
  }
  size_t nlines = 0, line = 0;
  const char *p = prompt, *end = prompt + len;
  for (;;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    line++;
    bool directive = false;
    if (n > 1 && p[0] == '/') {
      size_t wn = 1;
      while (wn < n && !echo_is_space(p[wn]))
        wn++;
      /* Only a known name followed by a space or the line's end is a directive: "/usr/bin" is text. */
      if (echo_known_directive(p + 1, wn - 1)) {
        directive = true;
        char name[16];
        memcpy(name, p + 1, wn - 1);
        name[wn - 1] = '\0';
        const char *arg = p + wn;
        size_t argn = n - wn;
        while (argn && echo_is_space(*arg)) {
          arg++;
          argn--;
        }
        while (argn && echo_is_space(arg[argn - 1]))
          argn--;
        if (!echo_directive(t, line, name, arg, argn))
          break;
      }
    }
    if (!directive)
      lines[nlines++] = (echo_span){.p = p, .n = n};
    if (!nl)
      break;
    p = nl + 1;
  }
  size_t first = 0, last = nlines;
  while (first < last && echo_blank(lines[first].p, lines[first].n))
    first++;
  while (last > first && echo_blank(lines[last - 1].p, lines[last - 1].n))
    last--;
  bool one_span = true;
  for (size_t i = first; i + 1 < last; i++)
    one_span = one_span && lines[i + 1].p == lines[i].p + lines[i].n + 1;
  if (first == last) {
    t->text = "";
    t->text_n = 0;
  } else if (one_span) {
    t->text = lines[first].p;
    t->text_n = (size_t)(lines[last - 1].p + lines[last - 1].n - lines[first].p);
  } else {
    echo_buf text = {.data = NULL, .len = 0, .cap = 0, .failed = false};
    for (size_t i = first; i < last; i++) {
      if (i > first)
        echo_buf_add(&text, "\n", 1);
      echo_buf_add(&text, lines[i].p, lines[i].n);
    }
    t->text_n = text.len;
    t->text = t->text_own = echo_buf_take(&text);
    if (!t->text)
      t->oom = true;
  }
  free(lines);
  return !t->oom && !t->error;
}

/* Check the content blocks (cheap: no text is read). Returns 0 and, in *bytes, about how long the prompt
 * text is (its blocks' strings), or AH_EINVAL. */
static int echo_check_content(const json_t *content, size_t *bytes) {
  *bytes = 0;
  size_t i = 0;
  const json_t *block = NULL;
  json_array_foreach(content, i, block) {
    const char *type = json_string_value(json_object_get(block, "type"));
    if (!json_is_object(block) || !type)
      return AH_EINVAL;
    if (strcmp(type, "text") == 0) {
      const json_t *tx = json_object_get(block, "text");
      if (!json_is_string(tx))
        return AH_EINVAL;
      *bytes += json_string_length(tx);
    } else if (strcmp(type, "resource_link") == 0) {
      const json_t *uri = json_object_get(block, "uri");
      if (!json_is_string(uri))
        return AH_EINVAL;
      *bytes += json_string_length(uri) + json_string_length(json_object_get(block, "name"));
    } else {
      /* Other block types (images, audio) carry nothing the echo could repeat. */
      AH_LOG_D("echo", "ignoring a content block of type \"%s\"", type);
    }
  }
  return 0;
}

/* The prompt text: the text blocks and rendered links concatenated (into t->prompt), or the one text block
 * itself when it is the only one (no copy). Up to the first NUL, as C strings are. False when out of memory.
 */
static bool echo_prompt(ah_provider_turn *t, const char **out, size_t *len) {
  echo_buf b = {.data = NULL, .len = 0, .cap = 0, .failed = false};
  size_t i = 0, blocks = 0;
  const json_t *block = NULL, *only = NULL;
  json_array_foreach(t->content, i, block) {
    const char *type = json_string_value(json_object_get(block, "type"));
    if (strcmp(type, "text") == 0 || strcmp(type, "resource_link") == 0) {
      blocks++;
      only = block;
    }
  }
  if (blocks == 1 && strcmp(json_string_value(json_object_get(only, "type")), "text") == 0) {
    const json_t *tx = json_object_get(only, "text");
    *out = json_string_value(tx);
    *len = strnlen(*out, json_string_length(tx));
    return true;
  }
  json_array_foreach(t->content, i, block) {
    const char *type = json_string_value(json_object_get(block, "type"));
    if (strcmp(type, "text") == 0) {
      echo_buf_str(&b, json_string_value(json_object_get(block, "text")));
    } else if (strcmp(type, "resource_link") == 0) {
      const char *uri = json_string_value(json_object_get(block, "uri"));
      const char *name = json_string_value(json_object_get(block, "name"));
      echo_buf_str(&b, "[");
      echo_buf_str(&b, name ? name : uri);
      echo_buf_str(&b, "](");
      echo_buf_str(&b, uri);
      echo_buf_str(&b, ")");
    }
  }
  t->prompt = echo_buf_take(&b);
  *out = t->prompt;
  *len = t->prompt ? b.len : 0;
  return t->prompt != NULL;
}

/* ---- running a turn ------------------------------------------------------------------------------------ */

static void echo_tick(ah_provider_turn *t);

static void echo_timer_cb(uv_timer_t *h) {
  echo_tick(h->data);
}

static void echo_next_cb(uv_idle_t *h) {
  uv_idle_stop(h);
  echo_tick(h->data);
}

static void echo_arm(ah_provider_turn *t, uint64_t ms) {
  if (ms == 0)
    uv_idle_start(&t->next, echo_next_cb);
  else
    uv_timer_start(&t->timer, echo_timer_cb, ms, 0);
}

/* After a sink call the agent may have ended, cancelled or freed the turn; only a live turn goes on. */
static bool echo_live(const ah_provider_turn *t) {
  return !t->freed && t->phase != ECHO_PHASE_DONE && !t->cancel_requested;
}

static void echo_end(ah_provider_turn *t, const char *reason, const char *error) {
  t->phase = ECHO_PHASE_DONE;
  uv_timer_stop(&t->timer);
  uv_idle_stop(&t->next);
  json_t *usage = json_pack("{s:I,s:I}", "inputTokens", (json_int_t)((t->input_bytes + 3) / 4),
                            "outputTokens", (json_int_t)((t->output_bytes + 3) / 4));
  t->sink.end(t->ctx, reason, usage, error);
  /* `t` may be closing now (turn_free from inside end): nothing below touches it. */
  json_decref(usage);
}

static void echo_commit(ah_provider_turn *t, const char *text) {
  t->output_bytes += strlen(text);
  t->committed = true;
  t->sink.commit(t->ctx, text);
}

/* Commit the echo: handed over as the JSON string it already is when the agent takes one (no copy). */
static void echo_commit_echo(ah_provider_turn *t) {
  t->output_bytes += json_string_length(t->echo);
  t->committed = true;
  if (AH_HAS(&t->sink, ah_turn_sink, commit_json))
    t->sink.commit_json(t->ctx, json_incref(t->echo));
  else
    t->sink.commit(t->ctx, json_string_value(t->echo));
}

/* Build the echo and cut it into /chunks pieces (on the thread pool, while compiling). */
static void echo_build(ah_provider_turn *t) {
  if (t->text_n > (size_t)INT32_MAX - 16) {
    t->oom = true;
    return;
  }
  /* One allocation, the string's own: json_sprintf() adopts the buffer it formats into. */
  t->echo = json_sprintf("echo: %.*s", (int)t->text_n, t->text);
  if (!t->echo) {
    t->oom = true;
    return;
  }
  const char *e = json_string_value(t->echo);
  size_t bytes = json_string_length(t->echo);
  /* Characters are counted as UTF-8 lead bytes, so a cut never falls inside a character. */
  size_t chars = 0;
  for (size_t i = 0; i < bytes; i++)
    if (((unsigned char)e[i] & 0xC0) != 0x80)
      chars++;
  size_t n = t->chunks < chars ? t->chunks : chars; /* never an empty delta */
  t->cuts = calloc(n + 1, sizeof *t->cuts);
  if (!t->cuts) {
    t->oom = true;
    return;
  }
  size_t k = 1, c = 0;
  for (size_t i = 0; i < bytes && k < n; i++) {
    if (((unsigned char)e[i] & 0xC0) == 0x80)
      continue;
    if (c == k * chars / n)
      t->cuts[k++] = i;
    c++;
  }
  t->cuts[n] = bytes;
  t->ndeltas = n;
}

/* Start the echo, unless there is none (an empty text after a directive committed something). */
static void echo_prepare(ah_provider_turn *t) {
  if (t->text_n == 0 && t->committed) {
    t->phase = ECHO_PHASE_END;
    return;
  }
  /* No larger than the echo: a 64 KiB block per turn made malloc consolidate its free lists each time,
   * a cost that grows with the heap (many live sessions). */
  size_t bytes = t->echo ? json_string_length(t->echo) : 0;
  t->piece = malloc((bytes < ECHO_DELTA_MAX ? bytes : ECHO_DELTA_MAX) + 1);
  if (!t->piece) {
    t->oom = true;
    return;
  }
  t->next_delta = 0;
  t->pos = 0;
  t->phase = ECHO_PHASE_DELTAS;
}

/* The next delta: the rest of the current /chunks piece, at most ECHO_DELTA_MAX bytes cut before a UTF-8
 * lead byte. */
static void echo_next_delta(ah_provider_turn *t) {
  const char *e = json_string_value(t->echo);
  size_t stop = t->cuts[t->next_delta + 1], b = stop;
  if (b - t->pos > ECHO_DELTA_MAX) {
    b = t->pos + ECHO_DELTA_MAX;
    while (b > t->pos + 1 && ((unsigned char)e[b] & 0xC0) == 0x80)
      b--;
  }
  memcpy(t->piece, e + t->pos, b - t->pos);
  t->piece[b - t->pos] = '\0';
  t->pos = b;
  if (b == stop)
    t->next_delta++;
  t->sink.delta(t->ctx, t->piece);
}

static void echo_run_step(ah_provider_turn *t, echo_step *s) {
  switch (s->kind) {
  case ECHO_STEP_SLEEP:
    echo_arm(t, s->ms);
    return;
  case ECHO_STEP_FAIL:
    echo_end(t, "error", s->text);
    return;
  case ECHO_STEP_TOOL:
    if (!t->sink.tool_call) {
      echo_end(t, "error", "/tool: the agent offers no tool calls");
      return;
    }
    snprintf(t->call_id, sizeof t->call_id, "call_%u", ++t->calls);
    t->phase = ECHO_PHASE_WAIT;
    t->waiting = ECHO_STEP_TOOL;
    t->sink.tool_call(t->ctx, t->call_id, s->text, s->args);
    return;
  case ECHO_STEP_ASK:
    if (!t->sink.ask) {
      echo_end(t, "error", "/ask: the agent cannot ask the user");
      return;
    }
    t->phase = ECHO_PHASE_WAIT;
    t->waiting = ECHO_STEP_ASK;
    t->sink.ask(t->ctx, s->text, NULL);
    return;
  case ECHO_STEP_SUBAGENT:
    if (!t->sink.subagent) {
      echo_end(t, "error", "/subagent: the agent cannot start a subagent");
      return;
    }
    t->phase = ECHO_PHASE_WAIT;
    t->waiting = ECHO_STEP_SUBAGENT;
    t->sink.subagent(t->ctx, s->text);
    return;
  case ECHO_STEP_HISTORY: {
    /* "history: N (role, role, …)": what the agent says came before this turn. */
    const json_t *h = AH_HAS(&t->sink, ah_turn_sink, history) ? t->sink.history(t->ctx) : NULL;
    echo_buf buf = {0};
    char head[48];
    snprintf(head, sizeof head, "history: %zu (", json_array_size(h));
    echo_buf_add(&buf, head, strlen(head));
    size_t i = 0;
    json_t *e = NULL;
    json_array_foreach(h, i, e) {
      const char *role = json_string_value(json_object_get(e, "role"));
      if (i)
        echo_buf_add(&buf, ", ", 2);
      echo_buf_add(&buf, role ? role : "?", strlen(role ? role : "?"));
    }
    echo_buf_add(&buf, ")", 1);
    char *text = echo_buf_take(&buf);
    if (!text) {
      echo_end(t, "error", ah_strerror(AH_ENOMEM));
      return;
    }
    t->pending_commit = text;
    echo_arm(t, 0);
    return;
  }
  default:
    echo_end(t, "error", "echo: internal error (unknown step)");
    return;
  }
}

/* One tick: at most one sink call, then re-arm, wait or end. */
static void echo_tick(ah_provider_turn *t) {
  if (t->freed || t->compiling || t->phase == ECHO_PHASE_DONE)
    return;
  if (t->cancel_requested) {
    echo_end(t, "cancelled", NULL);
    return;
  }
  if (t->error) {
    echo_end(t, "error", t->error);
    return;
  }
  if (t->oom) {
    echo_end(t, "error", ah_strerror(AH_ENOMEM));
    return;
  }
  if (t->refuse) {
    echo_end(t, "refusal", NULL);
    return;
  }
  if (t->pending_commit) {
    char *c = t->pending_commit;
    t->pending_commit = NULL;
    echo_commit(t, c);
    free(c);
    if (echo_live(t))
      echo_arm(t, 0);
    return;
  }
  for (;;) {
    switch (t->phase) {
    case ECHO_PHASE_STEPS:
      if (t->next_step < t->nsteps) {
        echo_run_step(t, &t->steps[t->next_step++]);
        return;
      }
      echo_prepare(t);
      if (t->oom) {
        echo_end(t, "error", ah_strerror(AH_ENOMEM));
        return;
      }
      continue;
    case ECHO_PHASE_DELTAS:
      if (t->next_delta < t->ndeltas) {
        /* The turn's memory outlives this callback even when it was freed meanwhile (see turn_free). */
        echo_next_delta(t);
        if (echo_live(t))
          echo_arm(t, 0);
        return;
      }
      t->phase = ECHO_PHASE_COMMIT;
      continue;
    case ECHO_PHASE_COMMIT:
      t->phase = ECHO_PHASE_END;
      echo_commit_echo(t);
      if (echo_live(t))
        echo_arm(t, 0);
      return;
    case ECHO_PHASE_END:
      echo_end(t, t->max_tokens ? "max-tokens" : "end", NULL);
      return;
    default: /* ECHO_PHASE_WAIT: no tick is armed while waiting */
      return;
    }
  }
}

/* A directive's result arrived: commit `text` (stolen; NULL = out of memory) on the next tick. */
static void echo_resume(ah_provider_turn *t, char *text) {
  t->phase = ECHO_PHASE_STEPS;
  t->waiting = ECHO_STEP_INVALID;
  if (!text)
    t->oom = true;
  t->pending_commit = text;
  echo_arm(t, 0);
}

static bool echo_waiting_for(const ah_provider_turn *t, echo_step_kind kind) {
  return t && !t->freed && !t->cancel_requested && t->phase == ECHO_PHASE_WAIT && t->waiting == kind;
}

/* `v` as text: a string as it is, anything else as compact JSON (NULL = "null"). */
static char *echo_json_text(const json_t *v) {
  if (json_is_string(v))
    return strdup(json_string_value(v));
  if (!v)
    return strdup("null");
  return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

/* `v` as compact JSON, strings quoted (NULL = "null"). */
static char *echo_json_text_compact(const json_t *v) {
  return json_dumps(v ? v : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
}

/* The concatenation of the strings up to a NULL (malloc'ed), or NULL when out of memory. */
static char *echo_concat(const char *first, ...) {
  echo_buf buf = {.data = NULL, .len = 0, .cap = 0, .failed = false};
  va_list ap;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *))
    echo_buf_str(&buf, s);
  va_end(ap);
  return echo_buf_take(&buf);
}

static void echo_turn_tool_result(ah_provider_turn *t, const char *call_id, const json_t *result,
                                  bool is_error) {
  if (!echo_waiting_for(t, ECHO_STEP_TOOL) || !call_id || strcmp(call_id, t->call_id) != 0) {
    AH_LOG_D("echo", "ignoring a tool result for %s", call_id ? call_id : "(null)");
    return;
  }
  const char *name = t->steps[t->next_step - 1].text;
  char *text = NULL;
  if (is_error) {
    /* An error is reported by its message when it has one. */
    const json_t *msg = json_is_object(result) ? json_object_get(result, "message") : NULL;
    char *e = echo_json_text(json_is_string(msg) ? msg : result);
    text = e ? echo_concat("tool ", name, " failed: ", e, (const char *)NULL) : NULL;
    free(e);
  } else {
    char *r = echo_json_text_compact(result);
    text = r ? echo_concat("tool ", name, ": ", r, (const char *)NULL) : NULL;
    free(r);
  }
  echo_resume(t, text);
}

static void echo_turn_answer(ah_provider_turn *t, const json_t *answer, bool cancelled) {
  if (!echo_waiting_for(t, ECHO_STEP_ASK)) {
    AH_LOG_D("echo", "ignoring an answer nobody waits for");
    return;
  }
  if (cancelled) {
    t->phase = ECHO_PHASE_STEPS;
    t->waiting = ECHO_STEP_INVALID;
    t->cancel_requested = true;
    echo_arm(t, 0);
    return;
  }
  char *a = echo_json_text(answer);
  echo_resume(t, a ? echo_concat("answer: ", a, (const char *)NULL) : NULL);
  free(a);
}

static void echo_turn_subagent_result(ah_provider_turn *t, const char *final_text, const char *reason) {
  if (!echo_waiting_for(t, ECHO_STEP_SUBAGENT)) {
    AH_LOG_D("echo", "ignoring a subagent result nobody waits for");
    return;
  }
  /* A child that did not end normally says so: "subagent (error): <text>". */
  const char *ft = final_text ? final_text : "";
  char *text = !reason || strcmp(reason, "end") == 0
                   ? echo_concat("subagent: ", ft, (const char *)NULL)
                   : echo_concat("subagent (", reason, "): ", ft, (const char *)NULL);
  echo_resume(t, text);
}

static void echo_turn_cancel(ah_provider_turn *t) {
  if (!t || t->freed || t->cancel_requested || t->phase == ECHO_PHASE_DONE)
    return;
  /* Whatever the turn waits for is abandoned: a late result is ignored (echo_waiting_for). */
  t->cancel_requested = true;
  uv_timer_stop(&t->timer);
  uv_idle_stop(&t->next);
  if (!t->compiling) /* else the compilation's completion arms the next tick */
    echo_arm(t, 0);
}

static void echo_turn_destroy(ah_provider_turn *t) {
  for (size_t i = 0; i < t->nsteps; i++) {
    free(t->steps[i].text);
    json_decref(t->steps[i].args);
  }
  free(t->steps);
  free(t->pending_commit);
  free(t->text_own);
  free(t->prompt);
  json_decref(t->content);
  json_decref(t->echo);
  free(t->cuts);
  free(t->piece);
  free(t->error);
  free(t);
}

static void echo_close_cb(uv_handle_t *h) {
  ah_provider_turn *t = h->data;
  if (--t->open_handles == 0)
    echo_turn_destroy(t);
}

static void echo_close(ah_provider_turn *t) {
  uv_close((uv_handle_t *)&t->timer, echo_close_cb);
  uv_close((uv_handle_t *)&t->next, echo_close_cb);
}

static void echo_turn_free(ah_provider_turn *t) {
  if (!t || t->freed)
    return;
  /* Also valid before end(): the turn then just stops, without telling the sink. While it is compiling,
   * the compilation's completion closes the timer. */
  t->freed = true;
  if (!t->compiling)
    echo_close(t);
}

/* The prompt text, its directives, the echo and its cuts (on the thread pool for a large prompt). Reads
 * only the content (immutable while the turn holds it) and writes only the turn, which the loop does not
 * read meanwhile. Then the prompt is released, here too: the echo has its own copy, and only the text's
 * length is read later. */
static void echo_compile(uv_work_t *w) {
  ah_provider_turn *t = w->data;
  const char *prompt = NULL;
  size_t len = 0;
  if (!echo_prompt(t, &prompt, &len)) {
    t->oom = true;
  } else {
    t->input_bytes = len;
    if (echo_parse(t, prompt, len))
      echo_build(t);
  }
  t->text = NULL; /* a span of the prompt or of text_own */
  free(t->text_own);
  t->text_own = NULL;
  free(t->prompt);
  t->prompt = NULL;
  json_decref(t->content);
  t->content = NULL;
}

/* Back on the loop: the first tick reports a malformed directive or starts the first step. */
static void echo_compiled(uv_work_t *w, int status) {
  ah_provider_turn *t = w->data;
  t->compiling = false;
  if (status != 0)
    t->oom = true; /* not run (the loop is closing); the turn ends "error" if anyone still listens */
  if (t->freed)
    echo_close(t);
  else
    echo_arm(t, 0);
}

static int echo_turn_start(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                           ah_provider_turn **out) {
  if (!p || !p->data || !in || !sink || !out || !AH_HAS_FIELD(in, ah_turn_input, content) ||
      !AH_HAS_FIELD(sink, ah_turn_sink, end) || !json_is_array(in->content) || !sink->delta ||
      !sink->commit || !sink->end)
    return AH_EINVAL;
  echo_state *st = p->data;
  size_t bytes = 0;
  int rc = echo_check_content(in->content, &bytes);
  if (rc < 0)
    return rc;
  ah_provider_turn *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  size_t sn = sink->struct_size < sizeof t->sink ? sink->struct_size : sizeof t->sink;
  memcpy(&t->sink, sink, sn);
  t->sink.struct_size = (uint32_t)sizeof t->sink;
  t->ctx = ctx;
  t->phase = ECHO_PHASE_STEPS;
  t->chunks = 1;
  if (uv_timer_init(st->loop, &t->timer) != 0) {
    echo_turn_destroy(t);
    return AH_EINTERNAL;
  }
  if (uv_idle_init(st->loop, &t->next) != 0) {
    t->open_handles = 1;
    uv_close((uv_handle_t *)&t->timer, echo_close_cb);
    return AH_EINTERNAL;
  }
  t->open_handles = 2;
  t->timer.data = t;
  t->next.data = t;
  /* The content is borrowed for this call: the turn keeps a reference until it is compiled. */
  t->content = json_incref((json_t *)in->content);
  t->work.data = t;
  t->compiling = true;
  if (bytes < ECHO_OFF_LOOP_BYTES) {
    echo_compile(&t->work);
    echo_compiled(&t->work, 0); /* arms the first tick: the sink is never called from in here */
  } else if (uv_queue_work(st->loop, &t->work, echo_compile, echo_compiled) != 0) {
    t->compiling = false;
    t->freed = true;
    echo_close(t);
    return AH_EINTERNAL;
  }
  *out = t;
  return 0;
}

ah_provider *ah__echo_provider_new(uv_loop_t *loop) {
  if (!loop)
    return NULL;
  ah_provider *p = calloc(1, sizeof *p);
  echo_state *st = calloc(1, sizeof *st);
  if (!p || !st) {
    free(p);
    free(st);
    return NULL;
  }
  st->loop = loop;
  p->struct_size = (uint32_t)sizeof *p;
  p->name = "echo";
  p->turn_start = echo_turn_start;
  p->turn_tool_result = echo_turn_tool_result;
  p->turn_answer = echo_turn_answer;
  p->turn_subagent_result = echo_turn_subagent_result;
  p->turn_cancel = echo_turn_cancel;
  p->turn_free = echo_turn_free;
  p->data = st;
  return p;
}

/* Whether a turn of `content` may run a /history step (a line "/history" in one of its text blocks): the
 * host reads the conversation so far from the store only for such a turn. */
bool ah__echo_uses_history(const json_t *content) {
  size_t i = 0;
  const json_t *block = NULL;
  json_array_foreach(content, i, block) {
    const char *text = json_string_value(json_object_get(block, "text"));
    for (const char *p = text; p && (p = strstr(p, "/history")) != NULL; p += 8)
      if ((p == text || p[-1] == '\n') && (p[8] == '\0' || echo_is_space(p[8])))
        return true;
  }
  return false;
}

void ah__echo_provider_free(ah_provider *p) {
  if (!p)
    return;
  free(p->data);
  free(p);
}
