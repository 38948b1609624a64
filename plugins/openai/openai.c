/* agenthost openai plugin — the provider type `openai`: any server that speaks OpenAI's Chat Completions
 * (OpenAI, DeepSeek, OpenRouter, Groq, Mistral, Ollama, llama.cpp's server, vLLM, LM Studio), streamed, on
 * the host's HTTP client (ABI 1.4).
 *
 * A turn is a loop of model round trips: a request with the conversation, the streamed answer (text
 * deltas, reasoning, tool calls assembled by index), then either the end of the turn or the tool calls —
 * run by the agent under the session's policy — whose results all go back in the next request. Retries
 * (connect errors, 408, 409, 429, 5xx, a stream that ends before any output) wait with a jittered
 * exponential backoff or the server's Retry-After, each wait recorded on the turn; cancel interrupts any
 * of it at once. The API key is read at turn start (an environment variable or a 0600 file), sent only in
 * the Authorization header and zeroed when the turn is freed: it never reaches a log, an event or an
 * error message. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <agenthost/plugin.h>
#include <agenthost/provider.h>

#include "chat.h"
#include "sse.h"

#define SSE_LINE_MAX ((size_t)4 << 20)    /* one line of the stream */
#define SSE_EVENT_MAX ((size_t)8 << 20)   /* one event's data */
#define ERROR_BODY_MAX ((size_t)64 << 10) /* what is kept of an error response */
#define BACKOFF_BASE_MS 1000
#define BACKOFF_CAP_MS 30000

typedef struct oa_state {
  const ah_host_api *api;
  ah_mount *m;
  ah_provider prov;
  json_t *no_stream_options;   /* provider names whose server refused stream_options */
  json_t *warned;              /* provider names whose unknown keys were logged */
  int transfers;               /* HTTP transfers in flight (a freed turn's too) */
  int turns;                   /* turns not yet freed from their last transfer */
  ah_withdraw_done_fn done;    /* withdraw waits for the transfers to end */
  struct oa_listing *listings; /* provider.models requests in flight */
} oa_state;

typedef struct oa_conf {
  const char *name; /* [provider.NAME] */
  char base_url[1024];
  const char *model;
  int64_t max_tokens;
  int64_t context_window;
  double temperature;
  bool has_temperature;
  const char *reasoning_effort; /* sent as reasoning_effort (the session's, else the configured one) */
  char *system_prompt;
  json_t *headers;
  const char *ca_file;
  uint32_t connect_timeout_ms;
  uint32_t idle_timeout_ms;
  int max_retries;
  int max_steps;
  bool stream; /* `stream = false`: whole answers (for servers that cannot stream tool calls) */
} oa_conf;

struct ah_provider_turn {
  oa_state *st;
  const ah_turn_sink *sink;
  void *ctx;
  oa_conf conf; /* its strings point into `own` */
  json_t *own;  /* {config, model, name}: what the turn's input lent for the call, kept for the turn */
  char *key;    /* the API key, or NULL; zeroed when freed */
  json_t *msgs;
  json_t *tools;
  oa_round round;
  sse_parser sse;
  ah_http *http;
  ah_timer *timer; /* a retry wait, or the posted start/end */
  int http_status;
  oa_buf err_body;
  json_t *err_headers; /* of an error answer */
  bool whole;          /* a 2xx answer that is one JSON document, not a stream */
  bool committed;      /* this round's text was committed (at its finish_reason, before the stream's end) */
  char stream_error[400]; /* a malformed stream: why */
  int step;               /* round trips made */
  int attempt;            /* retries of the current round trip */
  bool stream_options;
  bool retried_without_stream_options;
  int pending_results;
  bool emitting; /* inside the loop that reports tool calls */
  json_t *results;
  /* usage summed over the round trips */
  int64_t in_tokens, out_tokens, cached_tokens, reasoning_tokens, requests;
  int64_t context_tokens; /* the last round's prompt + completion: what the conversation holds now */
  char model_seen[128];
  json_t *models; /* the distinct models the round trips reported */
  bool cancelled;
  bool ended;
  bool freed; /* turn_free came while a transfer was still finishing */
  char *end_error;
  const char *end_reason;
};

/* ---- configuration ---------------------------------------------------------------------------------- */

static const char *cstr(const json_t *c, const char *k) {
  const char *v = json_string_value(json_object_get(c, k));
  return v && *v ? v : NULL;
}

static int num(const json_t *c, const char *k, int64_t def, int64_t min, int64_t max, int64_t *out, char *err,
               size_t cap) {
  const char *v = cstr(c, k);
  if (!v) {
    *out = def;
    return 0;
  }
  char *end = NULL;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (errno || *end || n < min || n > max) {
    snprintf(err, cap, "[provider] %s: must be a whole number from %lld to %lld", k, (long long)min,
             (long long)max);
    return -1;
  }
  *out = n;
  return 0;
}

static const char *const known_keys[] = {
    "type",
    "base_url",
    "model",
    "models",
    "api_key_env",
    "api_key_file",
    "max_tokens",
    "context_window",
    "temperature",
    "system_prompt_file",
    "headers",
    "connect_timeout_ms",
    "idle_timeout_ms",
    "max_retries",
    "max_steps",
    "ca_file",
    "reasoning_effort",
    "reasoning_efforts",
};

static void warn_unknown(oa_state *st, const char *name, const json_t *c) {
  if (json_object_get(st->warned, name))
    return;
  json_object_set_new(st->warned, name, json_true());
  const char *k = NULL;
  const json_t *v = NULL;
  json_object_foreach((json_t *)c, k, v) {
    bool known = false;
    for (size_t i = 0; i < sizeof known_keys / sizeof known_keys[0] && !known; i++)
      known = strcmp(k, known_keys[i]) == 0;
    if (!known)
      st->api->log(st->m, AH_PLOG_WARN, "[provider.%s]: unknown key %s (ignored)", name, k);
  }
}

/* A small file: at most `max` bytes, refused unless it belongs to this user and no one else may read it
 * when `secret`. malloc'ed text, or NULL with `err`. */
static char *read_file(const char *key, const char *path, size_t max, bool secret, char *err, size_t cap) {
  if (path[0] != '/') {
    snprintf(err, cap, "[provider] %s: must be an absolute path", key);
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    snprintf(err, cap, "[provider] %s: cannot read %s: %s", key, path,
             fd < 0 ? strerror(errno) : "not a file");
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  if (secret && (sb.st_uid != geteuid() || (sb.st_mode & 077) != 0)) {
    snprintf(err, cap,
             "[provider] %s: %s must belong to this user and be readable by no one else (chmod 600), "
             "since it holds a secret",
             key, path);
    close(fd);
    return NULL;
  }
  char *buf = malloc(max + 1);
  ssize_t n = buf ? read(fd, buf, max + 1) : -1;
  close(fd);
  if (n < 0 || (size_t)n > max) {
    snprintf(err, cap, "[provider] %s: %s is %s", key, path, n < 0 ? "unreadable" : "too large");
    if (buf)
      explicit_bzero(buf, max + 1);
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  return buf;
}

/* The configuration of [provider.NAME] (`pc`), the session's model (NULL = the configured one) and max
 * tokens (0 = the configured one); `need_model` false for a models listing. */
static int conf_load(oa_state *st, oa_conf *c, const char *name, const json_t *pc, const char *model,
                     int64_t max_tokens, bool need_model, char **key, char *err, size_t cap) {
  memset(c, 0, sizeof *c);
  c->name = name ? name : "openai";
  if (pc)
    warn_unknown(st, c->name, pc);
  const char *base = cstr(pc, "base_url");
  if (!base || (strncmp(base, "http://", 7) != 0 && strncmp(base, "https://", 8) != 0)) {
    snprintf(err, cap,
             "[provider.%s] base_url: required, an http:// or https:// URL (e.g. "
             "https://api.openai.com/v1)",
             c->name);
    return -1;
  }
  snprintf(c->base_url, sizeof c->base_url, "%s", base);
  size_t bl = strlen(c->base_url);
  while (bl && c->base_url[bl - 1] == '/')
    c->base_url[--bl] = '\0';
  c->model = model && *model ? model : cstr(pc, "model");
  if (!c->model && need_model) {
    snprintf(err, cap, "[provider.%s] model: no model is configured and the session names none", c->name);
    return -1;
  }
  int64_t v = 0;
  if (num(pc, "max_tokens", 0, 0, 10000000, &c->max_tokens, err, cap) ||
      num(pc, "context_window", 0, 0, 100000000, &c->context_window, err, cap) ||
      num(pc, "connect_timeout_ms", 30000, 1, 600000, &v, err, cap))
    return -1;
  c->connect_timeout_ms = (uint32_t)v;
  if (num(pc, "idle_timeout_ms", 300000, 1, 3600000, &v, err, cap))
    return -1;
  c->idle_timeout_ms = (uint32_t)v;
  if (num(pc, "max_retries", 4, 0, 20, &v, err, cap))
    return -1;
  c->max_retries = (int)v;
  if (num(pc, "max_steps", 50, 1, 1000, &v, err, cap))
    return -1;
  c->max_steps = (int)v;
  if (max_tokens > 0)
    c->max_tokens = max_tokens;
  const char *temp = cstr(pc, "temperature");
  if (temp) {
    char *end = NULL;
    c->temperature = strtod(temp, &end);
    if (*end || c->temperature < 0 || c->temperature > 2) {
      snprintf(err, cap, "[provider.%s] temperature: a number from 0 to 2", c->name);
      return -1;
    }
    c->has_temperature = true;
  }
  c->ca_file = cstr(pc, "ca_file");
  c->reasoning_effort = cstr(pc, "reasoning_effort");
  const char *stream = cstr(pc, "stream");
  c->stream = !stream || strcmp(stream, "true") == 0;
  if (stream && !c->stream && strcmp(stream, "false") != 0) {
    snprintf(err, cap, "[provider.%s] stream: true or false", c->name);
    return -1;
  }
  const char *spf = cstr(pc, "system_prompt_file");
  if (spf && !(c->system_prompt = read_file("system_prompt_file", spf, 1 << 20, false, err, cap)))
    return -1;
  const char *hdrs = cstr(pc, "headers");
  if (hdrs) { /* "Name: value, Name2: value2" */
    c->headers = json_object();
    char *copy = strdup(hdrs);
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
      char *colon = strchr(item, ':');
      while (*item == ' ')
        item++;
      if (!colon || colon == item) {
        snprintf(err, cap, "[provider.%s] headers: \"Name: value\" pairs separated by commas", c->name);
        free(copy);
        return -1;
      }
      *colon = '\0';
      char *val = colon + 1;
      while (*val == ' ')
        val++;
      json_object_set_new(c->headers, item, json_string(val));
    }
    free(copy);
  }
  /* The key: an environment variable or a private file, read now (never kept in the config). */
  const char *env = cstr(pc, "api_key_env");
  const char *file = cstr(pc, "api_key_file");
  *key = NULL;
  if (env) {
    const char *k = getenv(env);
    if (!k || !*k) {
      snprintf(err, cap, "[provider.%s] api_key_env: the environment variable %s is not set", c->name, env);
      return -1;
    }
    *key = strdup(k);
  } else if (file) {
    char *k = read_file("api_key_file", file, 4096, true, err, cap);
    if (!k)
      return -1;
    k[strcspn(k, "\r\n")] = '\0';
    *key = k;
  }
  return 0;
}

static void conf_free(oa_conf *c) {
  free(c->system_prompt);
  json_decref(c->headers);
  memset(c, 0, sizeof *c);
}

/* ---- the turn's end ----------------------------------------------------------------------------------- */

static void turn_release(ah_provider_turn *t);
static void commit_text(ah_provider_turn *t);
static void report_round(ah_provider_turn *t, const json_t *u);
static void maybe_withdrawn(oa_state *st);

/* One round trip's usage for the host (ABI 1.8 sink->usage), from the server's usage object. */
static void report_round(ah_provider_turn *t, const json_t *u) {
  if (t->ended || !AH_HAS(t->sink, ah_turn_sink, usage))
    return;
  json_int_t in = json_integer_value(json_object_get(u, "prompt_tokens"));
  json_int_t out = json_integer_value(json_object_get(u, "completion_tokens"));
  json_int_t cached =
      json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")) +
      json_integer_value(json_object_get(u, "prompt_cache_hit_tokens"));
  json_int_t reasoning = json_integer_value(
      json_object_get(json_object_get(u, "completion_tokens_details"), "reasoning_tokens"));
  json_t *r = json_pack("{s:I, s:I, s:I, s:I, s:i}", "inputTokens", in, "outputTokens", out,
                        "cachedInputTokens", cached, "reasoningTokens", reasoning, "requests", 1);
  if (t->round.model[0])
    json_object_set_new(r, "model", json_string(t->round.model));
  if (!u)
    json_object_set_new(r, "reported", json_false()); /* the server sent no usage for this round trip */
  t->sink->usage(t->ctx, r);
  json_decref(r);
}

static json_t *usage_json(ah_provider_turn *t) {
  json_t *u =
      json_pack("{s:I, s:I, s:I, s:I, s:I}", "inputTokens", (json_int_t)t->in_tokens, "outputTokens",
                (json_int_t)t->out_tokens, "cachedInputTokens", (json_int_t)t->cached_tokens,
                "reasoningTokens", (json_int_t)t->reasoning_tokens, "requests", (json_int_t)t->requests);
  if (t->model_seen[0])
    json_object_set_new(u, "model", json_string(t->model_seen));
  if (json_array_size(t->models) > 1) /* the sum is not one model's: the round trips are (model/usage) */
    json_object_set_new(u, "models", json_incref(t->models));
  if (t->context_tokens > 0)
    json_object_set_new(u, "contextTokens", json_integer((json_int_t)t->context_tokens));
  if (t->conf.context_window > 0)
    json_object_set_new(u, "contextWindow", json_integer((json_int_t)t->conf.context_window));
  return u;
}

/* The end, once. The sink is never called after. */
static void end_turn(ah_provider_turn *t, const char *reason, const char *error) {
  if (t->ended)
    return;
  t->ended = true;
  json_t *u = usage_json(t);
  t->sink->end(t->ctx, t->cancelled ? "cancelled" : reason, u, t->cancelled ? NULL : error);
  json_decref(u);
}

static void ended_later(ah_timer *tm, void *arg) {
  (void)tm;
  ah_provider_turn *t = arg;
  t->timer = NULL;
  end_turn(t, t->end_reason, t->end_error);
}

/* The end on a later loop turn (from turn_start or turn_cancel, which must not call the sink). */
static void end_later(ah_provider_turn *t, const char *reason, const char *error) {
  t->end_reason = reason;
  free(t->end_error);
  t->end_error = error ? strdup(error) : NULL;
  if (t->timer) {
    t->st->api->timer_stop(t->timer);
    t->timer = NULL;
  }
  if (t->st->api->timer_start(t->st->m, 0, 0, ended_later, t, &t->timer) != 0)
    end_turn(t, reason, error);
}

/* ---- one round trip ------------------------------------------------------------------------------------ */

static void send_round(ah_provider_turn *t);

static bool output_seen(const ah_provider_turn *t) {
  return t->round.output;
}

static void add_usage(ah_provider_turn *t) {
  const json_t *u = t->round.usage;
  t->requests++;
  if (t->round.model[0]) {
    bool known = false;
    size_t i;
    json_t *m;
    json_array_foreach(t->models, i, m) known = known || strcmp(json_string_value(m), t->round.model) == 0;
    if (!known && json_array_size(t->models) < 16) {
      if (!t->models)
        t->models = json_array();
      json_array_append_new(t->models, json_string(t->round.model));
    }
    snprintf(t->model_seen, sizeof t->model_seen, "%s", t->round.model);
  }
  report_round(t, u);
  if (!u)
    return;
  t->in_tokens += json_integer_value(json_object_get(u, "prompt_tokens"));
  t->out_tokens += json_integer_value(json_object_get(u, "completion_tokens"));
  t->context_tokens = json_integer_value(json_object_get(u, "prompt_tokens")) +
                      json_integer_value(json_object_get(u, "completion_tokens"));
  t->cached_tokens +=
      json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
  t->cached_tokens += json_integer_value(json_object_get(u, "prompt_cache_hit_tokens")); /* DeepSeek */
  t->reasoning_tokens += json_integer_value(
      json_object_get(json_object_get(u, "completion_tokens_details"), "reasoning_tokens"));
}

static int on_event(void *arg, const char *event, const char *data, size_t len) {
  (void)event;
  ah_provider_turn *t = arg;
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    t->round.done = true;
    return 0;
  }
  json_error_t je;
  json_t *chunk = json_loadb(data, len, 0, &je);
  const char *text = NULL, *reasoning = NULL;
  char err[400] = "";
  if (!chunk) {
    snprintf(t->stream_error, sizeof t->stream_error, "the provider sent a malformed stream event: %.200s",
             data);
    return 1;
  }
  int rc = oa_round_chunk(&t->round, chunk, &text, &reasoning, err, sizeof err);
  if (rc == 0 && text && !t->ended)
    t->sink->delta(t->ctx, text);
  if (rc == 0 && reasoning && !t->ended && AH_HAS(t->sink, ah_turn_sink, reasoning))
    t->sink->reasoning(t->ctx, reasoning);
  json_decref(chunk);
  /* The message is complete at its finish_reason: committed now, not at the stream's end (the usage and
   * [DONE] that follow can take a while). */
  if (rc == 0 && t->round.finish[0] && t->round.ncalls == 0)
    commit_text(t);
  if (rc) {
    snprintf(t->stream_error, sizeof t->stream_error, "%s", err);
    return 1;
  }
  return 0;
}

static int on_head(ah_http *h, int status, const json_t *headers, void *arg) {
  (void)h;
  ah_provider_turn *t = arg;
  t->http_status = status;
  const char *ct = json_string_value(json_object_get(headers, "content-type"));
  t->whole = status >= 200 && status < 300 && ct && strncasecmp(ct, "application/json", 16) == 0;
  json_decref(t->err_headers);
  t->err_headers = status < 200 || status >= 300 ? json_deep_copy(headers) : NULL; /* for Retry-After */
  return 0;
}

static int on_body(ah_http *h, const char *data, size_t len, void *arg) {
  (void)h;
  ah_provider_turn *t = arg;
  if (t->freed || t->ended)
    return 1;
  if (t->http_status < 200 || t->http_status >= 300) {
    size_t room = ERROR_BODY_MAX > t->err_body.len ? ERROR_BODY_MAX - t->err_body.len : 0;
    oa_buf_add(&t->err_body, data, len < room ? len : room);
    return 0;
  }
  if (t->whole) { /* one document: kept whole (the transfer's cap bounds it) */
    if (oa_buf_add(&t->err_body, data, len) != 0) {
      snprintf(t->stream_error, sizeof t->stream_error, "out of memory");
      return 1;
    }
    return 0;
  }
  int rc = sse_feed(&t->sse, data, len, on_event, t);
  if (rc < 0 && !t->stream_error[0])
    snprintf(t->stream_error, sizeof t->stream_error, "%s",
             rc == -1   ? "the provider sent a stream line longer than 4 MiB"
             : rc == -2 ? "the provider sent a stream event larger than 8 MiB"
                        : "out of memory");
  return rc != 0;
}

/* The wait before retry `attempt` (1-based): the server's Retry-After / retry-after-ms when it sent one
 * (capped), else a jittered exponential backoff. */
static uint64_t backoff_ms(int attempt) {
  uint64_t exp = (uint64_t)BACKOFF_BASE_MS << (attempt - 1 < 10 ? attempt - 1 : 10);
  if (exp > BACKOFF_CAP_MS)
    exp = BACKOFF_CAP_MS;
  uint32_t r = 0;
  if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
    r = (uint32_t)time(NULL);
  return exp / 2 + (uint64_t)(r % (uint32_t)(exp / 2 + 1)); /* [exp/2, exp] */
}

/* A retry's wait is over, or the turn's first round trip is due (turn_start posts it). */
static void retry_fire(ah_timer *tm, void *arg) {
  (void)tm;
  ah_provider_turn *t = arg;
  t->timer = NULL;
  if (t->cancelled) {
    end_turn(t, "cancelled", NULL);
    return;
  }
  send_round(t);
}

/* Retry the round trip when attempts are left: true when a retry was scheduled. */
static bool retry(ah_provider_turn *t, uint64_t server_wait_ms, const char *why) {
  if (t->attempt >= t->conf.max_retries || t->cancelled)
    return false;
  t->attempt++;
  uint64_t wait = server_wait_ms ? server_wait_ms : backoff_ms(t->attempt);
  if (wait > 10 * 60 * 1000)
    wait = 10 * 60 * 1000;
  char msg[400];
  snprintf(msg, sizeof msg, "%s, retrying in %.1f s (%d of %d)", why, (double)wait / 1000.0, t->attempt,
           t->conf.max_retries);
  if (AH_HAS(t->sink, ah_turn_sink, notice)) {
    json_t *note = json_pack("{s:s, s:s, s:i, s:i, s:I}", "kind", "retry", "message", msg, "attempt",
                             t->attempt, "attempts", t->conf.max_retries, "waitMs", (json_int_t)wait);
    t->sink->notice(t->ctx, note);
    json_decref(note);
  }
  t->st->api->log(t->st->m, AH_PLOG_INFO, "[provider.%s] %s", t->conf.name, msg);
  if (t->st->api->timer_start(t->st->m, wait, 0, retry_fire, t, &t->timer) != 0)
    return false;
  return true;
}

/* Retry-After (seconds or an HTTP date) or retry-after-ms, in ms; 0 when absent or unreadable. */
static uint64_t server_wait(const json_t *headers) {
  const char *ms = json_string_value(json_object_get(headers, "retry-after-ms"));
  if (ms) {
    char *end = NULL;
    double v = strtod(ms, &end);
    if (end != ms && v > 0)
      return (uint64_t)v;
  }
  const char *ra = json_string_value(json_object_get(headers, "retry-after"));
  if (!ra)
    return 0;
  char *end = NULL;
  double secs = strtod(ra, &end);
  if (end != ra && *end == '\0' && secs >= 0)
    return (uint64_t)(secs * 1000.0);
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  if (strptime(ra, "%a, %d %b %Y %H:%M:%S GMT", &tm)) {
    time_t when = timegm(&tm);
    time_t now = time(NULL);
    return when > now ? (uint64_t)(when - now) * 1000 : 1;
  }
  return 0;
}

/* The server's own message of an error body ({error: {message}} or {message} or text), cut to 300. */
static void server_message(const ah_provider_turn *t, char *out, size_t cap, char *code, size_t code_cap) {
  code[0] = '\0';
  out[0] = '\0';
  json_t *j = t->err_body.len ? json_loadb(t->err_body.p, t->err_body.len, 0, NULL) : NULL;
  const json_t *e = json_object_get(j, "error");
  const char *m = json_is_object(e) ? json_string_value(json_object_get(e, "message")) : json_string_value(e);
  if (!m)
    m = json_string_value(json_object_get(j, "message"));
  const char *c = json_is_object(e) ? json_string_value(json_object_get(e, "code")) : NULL;
  if (!c && json_is_object(e))
    c = json_string_value(json_object_get(e, "type"));
  if (c)
    snprintf(code, code_cap, "%s", c);
  if (m)
    snprintf(out, cap, "%.300s", m);
  else if (t->err_body.len)
    snprintf(out, cap, "%.300s", t->err_body.p);
  json_decref(j);
}

static bool context_overflow(const char *code, const char *msg) {
  return (code &&
          (strcmp(code, "context_length_exceeded") == 0 || strcmp(code, "exceed_context_size_error") == 0)) ||
         strstr(msg, "context_length_exceeded") || strstr(msg, "maximum context length") ||
         strstr(msg, "exceed_context_size") || strstr(msg, "context window");
}

static void handle_status(ah_provider_turn *t, const json_t *headers) {
  int s = t->http_status;
  char msg[400], code[64];
  server_message(t, msg, sizeof msg, code, sizeof code);
  char why[2048];
  if (s == 408 || s == 409 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504) {
    snprintf(why, sizeof why, "%s answered %d%s%s", t->conf.base_url, s, msg[0] ? ": " : "", msg);
    if (retry(t, server_wait(headers), s == 429 ? "rate limited" : "the provider is unavailable"))
      return;
    end_turn(t, "error", why);
    return;
  }
  if (s == 400 && t->stream_options && !t->retried_without_stream_options && strstr(msg, "stream_options")) {
    /* A server that does not know stream_options: once without, and remembered for this provider. */
    t->retried_without_stream_options = true;
    t->stream_options = false;
    json_object_set_new(t->st->no_stream_options, t->conf.name, json_true());
    send_round(t);
    return;
  }
  if (context_overflow(code, msg)) {
    snprintf(why, sizeof why,
             "the conversation does not fit the model's context window (%s)%s%s; start a new session or set "
             "context_window for [provider.%s]",
             t->conf.model, msg[0] ? ": " : "", msg, t->conf.name);
  } else if (s == 401 || s == 403) {
    snprintf(why, sizeof why, "the provider rejected the API key for %s (%d)", t->conf.base_url, s);
  } else if (s == 404) {
    snprintf(why, sizeof why, "%s answered 404: no model %s there (or no chat/completions)%s%s",
             t->conf.base_url, t->conf.model, msg[0] ? ": " : "", msg);
  } else {
    snprintf(why, sizeof why, "%s answered %d%s%s", t->conf.base_url, s, msg[0] ? ": " : "", msg);
  }
  end_turn(t, "error", why);
}

static void results_ready(ah_provider_turn *t);

/* A finished round with tool calls: each reported to the agent; the next round trip when all results are
 * in. */
static void run_calls(ah_provider_turn *t) {
  json_array_append_new(t->msgs, oa_assistant_message(&t->round));
  json_decref(t->results);
  t->results = json_array();
  t->pending_results = t->round.ncalls;
  t->emitting = true;
  for (int i = 0; i < t->round.ncalls && !t->ended; i++) {
    oa_call *c = &t->round.calls[i];
    const char *id = c->id.p && *c->id.p ? c->id.p : NULL;
    char gen[32];
    if (!id) { /* a server that sends no id: one of ours, so that the result can be matched */
      snprintf(gen, sizeof gen, "call_%d_%d", t->step, i);
      oa_buf_add(&c->id, gen, strlen(gen));
      id = c->id.p;
      json_t *calls = json_object_get(json_array_get(t->msgs, json_array_size(t->msgs) - 1), "tool_calls");
      json_object_set_new(json_array_get(calls, (size_t)i), "id", json_string(id));
    }
    json_t *args = c->args.len ? json_loadb(c->args.p, c->args.len, 0, NULL) : json_object();
    if (!json_is_object(args)) {
      json_decref(args);
      /* Not valid JSON: the model learns it from the result; nothing runs. */
      json_array_append_new(t->results,
                            json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id, "content",
                                      "error: the arguments were not a valid JSON object"));
      t->pending_results--;
      continue;
    }
    t->sink->tool_call(t->ctx, id, c->name.p ? c->name.p : "", args);
    json_decref(args);
  }
  t->emitting = false;
  if (t->pending_results <= 0 && !t->ended)
    results_ready(t);
}

static void results_ready(ah_provider_turn *t) {
  /* results in the order of the calls */
  for (int i = 0; i < t->round.ncalls; i++) {
    const char *id = t->round.calls[i].id.p;
    size_t k = 0;
    json_t *r = NULL;
    json_array_foreach(t->results, k, r) {
      if (id && strcmp(json_string_value(json_object_get(r, "tool_call_id")), id) == 0) {
        json_array_append(t->msgs, r);
        break;
      }
    }
  }
  json_decref(t->results);
  t->results = NULL;
  if (t->step >= t->conf.max_steps) {
    char why[2048];
    snprintf(why, sizeof why, "the model made %d round trips without finishing (max_steps)", t->step);
    end_turn(t, "error", why);
    return;
  }
  t->attempt = 0;
  send_round(t);
}

/* The round's text as one committed message, once. */
static void commit_text(ah_provider_turn *t) {
  if (t->committed || !t->round.text.len || t->ended)
    return;
  t->committed = true;
  json_t *text = json_stringn(t->round.text.p, t->round.text.len);
  if (!text)
    text = json_string("(the provider sent text that is not UTF-8)");
  if (AH_HAS(t->sink, ah_turn_sink, commit_json)) {
    t->sink->commit_json(t->ctx, text);
  } else {
    t->sink->commit(t->ctx, json_string_value(text));
    json_decref(text);
  }
}

static void round_done(ah_provider_turn *t) {
  commit_text(t);
  add_usage(t);
  const char *fin = t->round.finish;
  if (t->round.ncalls > 0 && (strcmp(fin, "tool_calls") == 0 || strcmp(fin, "function_call") == 0 || !*fin ||
                              strcmp(fin, "stop") == 0)) {
    run_calls(t);
    return;
  }
  if (strcmp(fin, "length") == 0)
    end_turn(t, "max-tokens", NULL);
  else if (strcmp(fin, "content_filter") == 0)
    end_turn(t, "refusal", "the provider's content filter stopped the answer");
  else
    end_turn(t, "end", NULL);
}

/* A round that cannot finish: what text it streamed is kept (committed), then the turn ends with `why`. */
static void end_broken(ah_provider_turn *t, const char *why) {
  commit_text(t);
  add_usage(t);
  end_turn(t, "error", why);
}

static void on_done(ah_http *h, int status, const char *message, void *arg) {
  (void)h;
  ah_provider_turn *t = arg;
  t->http = NULL;
  t->st->transfers--;
  if (t->freed) {
    turn_release(t);
    return;
  }
  if (t->ended)
    return;
  if (t->cancelled) {
    end_turn(t, "cancelled", NULL);
    return;
  }
  bool ok_status = t->http_status >= 200 && t->http_status < 300;
  if (t->stream_error[0]) { /* a malformed or oversized stream: not retried */
    end_broken(t, t->stream_error);
    return;
  }
  if (status != 0) {
    if (ok_status && output_seen(t)) {
      char why[2048];
      snprintf(why, sizeof why, "the provider's stream ended early (%.300s)", message);
      end_broken(t, why);
      return;
    }
    if (status != AH_ECANCELED && status != AH_E2BIG && retry(t, 0, message))
      return;
    char why[2048];
    snprintf(why, sizeof why, "%s (base_url %s)", message, t->conf.base_url);
    end_turn(t, "error", why);
    return;
  }
  if (!ok_status) {
    handle_status(t, t->err_headers);
    return;
  }
  if (t->whole) { /* a whole answer: one chunk, its text shown as one delta before it is committed */
    json_t *doc = json_loadb(t->err_body.p ? t->err_body.p : "", t->err_body.len, 0, NULL);
    const char *text = NULL, *reasoning = NULL;
    char err[400] = "";
    if (!doc || oa_round_chunk(&t->round, doc, &text, &reasoning, err, sizeof err) != 0) {
      char why[2048];
      snprintf(why, sizeof why, "%s%.200s", doc ? "" : "the provider sent a malformed answer: ",
               doc ? err : (t->err_body.p ? t->err_body.p : ""));
      json_decref(doc);
      end_turn(t, "error", why);
      return;
    }
    if (reasoning && AH_HAS(t->sink, ah_turn_sink, reasoning))
      t->sink->reasoning(t->ctx, reasoning);
    if (text)
      t->sink->delta(t->ctx, text);
    t->round.done = true;
    json_decref(doc);
    round_done(t);
    return;
  }
  if (!t->round.done && !t->round.finish[0]) { /* the body ended without [DONE] or a finish reason */
    if (!output_seen(t)) {
      char why[2048];
      snprintf(why, sizeof why, "the stream from %s ended before any output", t->conf.base_url);
      if (retry(t, 0, why))
        return;
      end_turn(t, "error", why);
      return;
    }
    end_broken(t, "the provider's stream ended early");
    return;
  }
  round_done(t);
}

/* The headers of a request to the provider: `accept`, the configured headers, and the key as
 * Authorization: Bearer KEY when there is one. Free them with headers_free(), which wipes the key's copy. */
static json_t *request_headers(const oa_conf *c, const char *key, const char *accept, bool json_body) {
  json_t *h = json_pack("{s:s}", "Accept", accept);
  if (json_body)
    json_object_set_new(h, "Content-Type", json_string("application/json"));
  if (c->headers)
    json_object_update(h, c->headers);
  char *auth = NULL;
  if (key && asprintf(&auth, "Bearer %s", key) >= 0) {
    json_object_set_new(h, "Authorization", json_string(auth));
    explicit_bzero(auth, strlen(auth));
    free(auth);
  }
  return h;
}

/* libcurl keeps its own copy of the headers for the transfer: ours is wiped as soon as it was handed over. */
static void headers_free(json_t *h) {
  json_t *a = json_object_get(h, "Authorization");
  if (a)
    explicit_bzero((char *)json_string_value(a), json_string_length(a));
  json_decref(h);
}

static json_t *request_body(ah_provider_turn *t) {
  json_t *b =
      json_pack("{s:s, s:O, s:b}", "model", t->conf.model, "messages", t->msgs, "stream", t->conf.stream);
  if (t->stream_options && t->conf.stream)
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
  if (json_array_size(t->tools) > 0)
    json_object_set(b, "tools", t->tools);
  if (t->conf.max_tokens > 0)
    json_object_set_new(b, "max_tokens", json_integer(t->conf.max_tokens));
  if (t->conf.has_temperature)
    json_object_set_new(b, "temperature", json_real(t->conf.temperature));
  if (t->conf.reasoning_effort)
    json_object_set_new(b, "reasoning_effort", json_string(t->conf.reasoning_effort));
  return b;
}

static void send_round(ah_provider_turn *t) {
  oa_state *st = t->st;
  oa_round_reset(&t->round);
  t->committed = false;
  sse_free(&t->sse);
  sse_init(&t->sse, SSE_LINE_MAX, SSE_EVENT_MAX);
  oa_buf_free(&t->err_body);
  t->stream_error[0] = '\0';
  t->http_status = 0;
  if (t->attempt == 0)
    t->step++;
  if (t->conf.context_window > 0) {
    int64_t budget = t->conf.context_window - (t->conf.max_tokens > 0 ? t->conf.max_tokens : 0);
    int dropped = oa_fit(t->msgs, t->tools, budget);
    if (dropped > 0 && AH_HAS(t->sink, ah_turn_sink, notice)) {
      json_t *note = json_pack("{s:s, s:i, s:s}", "kind", "history-cut", "dropped", dropped, "message",
                               "the oldest messages were left out to fit the context window");
      t->sink->notice(t->ctx, note);
      json_decref(note);
    }
  }
  json_t *body = request_body(t);
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  char url[1200];
  snprintf(url, sizeof url, "%s/chat/completions", t->conf.base_url);
  json_t *headers = request_headers(&t->conf, t->key, "text/event-stream", true);
  ah_http_request req = {
      .struct_size = sizeof req,
      .method = "POST",
      .url = url,
      .headers = headers,
      .body = text,
      .body_len = text ? strlen(text) : 0,
      .ca_file = t->conf.ca_file,
      .max_response = (size_t)256 << 20,
      .connect_timeout_ms = t->conf.connect_timeout_ms,
      .idle_timeout_ms = t->conf.idle_timeout_ms,
      .on_head = on_head,
      .on_body = on_body,
      .on_done = on_done,
      .arg = t,
  };
  int rc = text ? st->api->http_start(st->m, &req, &t->http) : AH_ENOMEM;
  headers_free(headers);
  free(text);
  if (rc) {
    t->http = NULL;
    end_turn(t, "error",
             rc == AH_EINVAL ? "the provider's base_url or headers are invalid" : "cannot start the request");
    return;
  }
  st->transfers++;
}

/* ---- the provider interface -----------------------------------------------------------------------------
 */

static int turn_start(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                      ah_provider_turn **out) {
  oa_state *st = p->data;
  ah_provider_turn *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  t->st = st;
  t->sink = sink;
  t->ctx = ctx;
  st->turns++;
  sse_init(&t->sse, SSE_LINE_MAX, SSE_EVENT_MAX);
  char err[600] = "";
  /* The input is borrowed for this call only: the turn keeps its own copy of what its configuration
   * points into (the session's model may change, the configuration be reloaded, meanwhile). */
  const json_t *lent = AH_HAS(in, ah_turn_input, provider_config) ? in->provider_config : NULL;
  t->own =
      json_pack("{s:o, s:s?, s:s}", "config", lent ? json_deep_copy(lent) : json_object(), "model", in->model,
                "name", AH_HAS(in, ah_turn_input, provider_name) ? in->provider_name : "openai");
  if (!t->own) {
    turn_release(t);
    return AH_ENOMEM;
  }
  const json_t *pc = lent ? json_object_get(t->own, "config") : NULL;
  const char *pname = cstr(t->own, "name");
  if (conf_load(st, &t->conf, pname, pc, cstr(t->own, "model"), in->max_tokens, true, &t->key, err,
                sizeof err) != 0) {
    *out = t;
    end_later(t, "error", err);
    return 0;
  }
  t->stream_options = !json_object_get(st->no_stream_options, t->conf.name);
  const json_t *history = sink->history ? sink->history(ctx) : NULL;
  t->msgs = oa_messages(t->conf.system_prompt, history, in->content);
  t->tools = oa_tools(in->tools);
  *out = t;
  if (st->api->timer_start(st->m, 0, 0, retry_fire, t, &t->timer) != 0) {
    *out = NULL;
    turn_release(t);
    return AH_ENOMEM;
  }
  return 0;
}

static void turn_tool_result(ah_provider_turn *t, const char *call_id, const json_t *result, bool is_error) {
  if (t->ended || !t->results)
    return;
  json_t *content = json_is_string(result) ? json_incref((json_t *)result) : NULL;
  if (!content) {
    char *s = json_dumps(result ? result : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
    content = json_string(s ? s : "null");
    free(s);
  }
  if (is_error && json_is_string(content)) {
    char *s = NULL;
    if (asprintf(&s, "error: %s", json_string_value(content)) >= 0) {
      json_decref(content);
      content = json_string(s);
    }
    free(s);
  }
  json_array_append_new(t->results, json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", call_id,
                                              "content", content ? content : json_string("")));
  if (--t->pending_results == 0 && !t->emitting)
    results_ready(t);
}

static void turn_answer(ah_provider_turn *t, const json_t *answer, bool cancelled) {
  (void)t, (void)answer, (void)cancelled; /* this provider never asks */
}

static void turn_subagent_result(ah_provider_turn *t, const char *final_text, const char *reason) {
  (void)t, (void)final_text, (void)reason; /* nor starts subagents */
}

static void turn_cancel(ah_provider_turn *t) {
  if (t->ended || t->cancelled)
    return;
  t->cancelled = true;
  if (t->http) {
    t->st->api->http_abort(t->http); /* on_done ends the turn `cancelled` */
    return;
  }
  end_later(t, "cancelled", NULL); /* a retry wait, tool results pending, or not started */
}

static void turn_release(ah_provider_turn *t) {
  oa_state *st = t->st;
  if (t->timer)
    st->api->timer_stop(t->timer);
  if (t->key) {
    explicit_bzero(t->key, strlen(t->key));
    free(t->key);
  }
  conf_free(&t->conf);
  json_decref(t->own);
  json_decref(t->msgs);
  json_decref(t->tools);
  json_decref(t->results);
  oa_round_reset(&t->round);
  sse_free(&t->sse);
  oa_buf_free(&t->err_body);
  json_decref(t->err_headers);
  json_decref(t->models);
  free(t->end_error);
  free(t);
  st->turns--;
  maybe_withdrawn(st);
}

/* A withdraw waiting for the last transfer: done now. */
static void maybe_withdrawn(oa_state *st) {
  if (!st->done || st->transfers > 0 || st->turns > 0)
    return;
  ah_withdraw_done_fn done = st->done;
  st->done = NULL;
  ah_mount *m = st->m;
  json_decref(st->no_stream_options);
  json_decref(st->warned);
  free(st);
  done(m);
}

static void turn_free(ah_provider_turn *t) {
  if (t->http) { /* its on_done frees it */
    t->freed = true;
    t->st->api->http_abort(t->http);
    return;
  }
  turn_release(t);
}

/* ---- provider.models: GET {base_url}/models ------------------------------------------------------------ */

typedef struct oa_listing {
  oa_state *st;
  ah_http *http;
  oa_buf body;
  int status;
  void (*done)(void *arg, int status, const json_t *models, const char *message);
  void *arg;
  char base_url[1024];
  struct oa_listing *next;
} oa_listing;

static int listing_head(ah_http *h, int status, const json_t *headers, void *arg) {
  (void)h, (void)headers;
  ((oa_listing *)arg)->status = status;
  return 0;
}

static int listing_body(ah_http *h, const char *data, size_t len, void *arg) {
  (void)h;
  return oa_buf_add(&((oa_listing *)arg)->body, data, len) != 0;
}

static void maybe_withdrawn(oa_state *st);

static void listing_done(ah_http *h, int status, const char *message, void *arg) {
  (void)h;
  oa_listing *l = arg;
  oa_state *st = l->st;
  for (oa_listing **p = &st->listings; *p; p = &(*p)->next)
    if (*p == l) {
      *p = l->next;
      break;
    }
  st->transfers--;
  json_t *doc = status == 0 && l->body.len ? json_loadb(l->body.p, l->body.len, 0, NULL) : NULL;
  json_t *data = json_object_get(doc, "data");
  if (!data)
    data = json_object_get(doc, "models"); /* Ollama's /api/tags shape, should base_url point there */
  char why[1400];
  if (status) {
    l->done(l->arg, status, NULL, message);
  } else if (l->status == 401 || l->status == 403) {
    snprintf(why, sizeof why, "the provider rejected the API key for %s (%d)", l->base_url, l->status);
    l->done(l->arg, AH_EPERM, NULL, why);
  } else if (l->status < 200 || l->status >= 300 || !json_is_array(data)) {
    snprintf(why, sizeof why, "%s/models answered %d without a model list", l->base_url, l->status);
    l->done(l->arg, AH_EPROTO, NULL, why);
  } else {
    json_t *out = json_array();
    size_t i = 0;
    json_t *mo = NULL;
    json_array_foreach(data, i, mo) {
      const char *id = json_string_value(json_object_get(mo, "id"));
      if (!id)
        id = json_string_value(json_object_get(mo, "name"));
      if (id)
        json_array_append_new(out, json_pack("{s:s, s:s*}", "id", id, "ownedBy",
                                             json_string_value(json_object_get(mo, "owned_by"))));
    }
    l->done(l->arg, 0, out, NULL);
    json_decref(out);
  }
  json_decref(doc);
  oa_buf_free(&l->body);
  free(l);
  maybe_withdrawn(st);
}

static int list_models(ah_provider *p, const char *name, const json_t *config,
                       void (*done)(void *arg, int status, const json_t *models, const char *message),
                       void *arg) {
  oa_state *st = p->data;
  if (st->done)
    return AH_ESTATE;
  oa_conf c;
  char *key = NULL;
  char err[600];
  if (conf_load(st, &c, name, config, NULL, 0, false, &key, err, sizeof err) != 0) {
    st->api->log(st->m, AH_PLOG_WARN, "%s", err);
    conf_free(&c);
    return AH_ECONFIG;
  }
  oa_listing *l = calloc(1, sizeof *l);
  if (!l) {
    conf_free(&c);
    return AH_ENOMEM;
  }
  l->st = st;
  l->done = done;
  l->arg = arg;
  snprintf(l->base_url, sizeof l->base_url, "%s", c.base_url);
  char url[1200];
  snprintf(url, sizeof url, "%s/models", c.base_url);
  json_t *headers = request_headers(&c, key, "application/json", false);
  ah_http_request req = {.struct_size = sizeof req,
                         .method = "GET",
                         .url = url,
                         .headers = headers,
                         .ca_file = c.ca_file,
                         .max_response = (size_t)8 << 20,
                         .connect_timeout_ms = c.connect_timeout_ms,
                         .idle_timeout_ms = 60000,
                         .total_timeout_ms = 120000,
                         .on_head = listing_head,
                         .on_body = listing_body,
                         .on_done = listing_done,
                         .arg = l};
  int rc = st->api->http_start(st->m, &req, &l->http);
  headers_free(headers);
  if (key) {
    explicit_bzero(key, strlen(key));
    free(key);
  }
  conf_free(&c);
  if (rc) {
    free(l);
    return rc;
  }
  st->transfers++;
  l->next = st->listings;
  st->listings = l;
  return 0;
}

/* ---- mount and withdraw -----------------------------------------------------------------------------------
 */

static int oa_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  if (!AH_HAS(api, ah_host_api, register_provider) || !AH_HAS(api, ah_host_api, timer_start)) {
    api->log(m, AH_PLOG_ERROR, "this host lacks the provider interface (ABI 1.1)");
    return AH_EABI;
  }
  if (!AH_HAS(api, ah_host_api, http_start)) {
    api->log(m, AH_PLOG_ERROR,
             "this host has no HTTP client (built without the `http` feature, or older than ABI 1.4): the "
             "openai provider cannot run");
    return AH_EUNAVAILABLE;
  }
  oa_state *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->api = api;
  st->m = m;
  st->no_stream_options = json_object();
  st->warned = json_object();
  st->prov = (ah_provider){
      .struct_size = sizeof st->prov,
      .name = "openai",
      .turn_start = turn_start,
      .turn_tool_result = turn_tool_result,
      .turn_answer = turn_answer,
      .turn_subagent_result = turn_subagent_result,
      .turn_cancel = turn_cancel,
      .turn_free = turn_free,
      .data = st,
      .flags = AH_PROVIDER_TOOL_HISTORY,
      .list_models = list_models,
  };
  *state = st;
  return api->register_provider(m, &st->prov);
}

static void oa_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  oa_state *st = state;
  if (!st) {
    done(m);
    return;
  }
  /* The host freed every turn first (turn_free): what is left are transfers finishing their abort; a
   * models listing is aborted here (its caller gets AH_ECANCELED). */
  if (st->transfers > 0 || st->turns > 0) {
    st->done = done;
    for (oa_listing *l = st->listings; l; l = l->next)
      st->api->http_abort(l->http);
    return;
  }
  json_decref(st->no_stream_options);
  json_decref(st->warned);
  free(st);
  done(m);
}

static const ah_plugin_desc oa_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "openai",
    .version = "0.1.0",
    .description =
        "Provider type openai: OpenAI-compatible Chat Completions, streamed, over the host's HTTP client",
    .mount = oa_mount,
    .withdraw = oa_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  if (AH_ABI_MAJOR_OF(host_abi) != AH_ABI_MAJOR)
    return NULL;
  return &oa_desc;
}
