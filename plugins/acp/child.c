/* agenthost — the `acp` provider: every turn runs a fresh external ACP v1 agent as a child process
 * (PROTOCOLS.md ACP-CHILD-CAPABILITIES, ACP-CHILD-START, ACP-CHILD-ENV-POLICY / MERGE, ACP-CHILD-CANCEL).
 *
 * We are the ACP *client* toward the child. One turn ("run") goes through these phases:
 *   START    the configuration is read and checked, the cwd is checked; nothing is spawned when it fails;
 *   INIT     the child was spawned (own process group, environment = the core's allowlist + the configured
 *            variables) and `initialize` {protocolVersion 1, fs/terminal false} was sent;
 *   SESSION  `session/new` {cwd, mcpServers: []} was sent;
 *   PROMPT   the run is published (logged "ready"): `session/prompt` carries the new user message only;
 *            `agent_message_chunk` texts become sink deltas, and the whole text one commit at the end;
 *   DONE     end() was reported: no more sink calls; the child is being disposed or is gone.
 * A failure or a cancellation before PROMPT reclaims the child and ends the turn `error` (`cancelled`).
 *
 * Dispose (exactly once per run): session/cancel once (when a prompt is outstanding), every pending
 * permission request answered `cancelled`, the JSON-RPC peer closed (flushing what was written), then stdin
 * EOF; after ACP_EOF_GRACE_MS api->process_kill() (SIGTERM to the group, SIGKILL after ACP_KILL_GRACE_MS).
 * The run is over only once on_exit observed the exit, every handle is closed and the host called
 * turn_free(): the run object is owned by the acp_child state, so it outlives the host's turn and
 * acp_child_withdraw() waits for all of them.
 *
 * Callbacks never call the sink from inside a call the host makes into the provider (turn_start,
 * turn_cancel, turn_answer, turn_free): those record what happened and arm a zero-delay host timer.
 *
 * The child's stderr is read through a duplicate of the pipe's descriptor on a handle of our own: a raw
 * libuv read callback cannot reach the host API without a static (only process_of_stream() maps a stream to
 * its process, and calling it needs the API table), and this plugin keeps no static state.
 */
#include "child.h"

#include "envname.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ACP_PROTOCOL_VERSION 1
#define ACP_MAX_LINE ((size_t)16 * 1024 * 1024) /* a line from the child, before any parse */
#define ACP_MAX_TEXT ((size_t)16 * 1024 * 1024) /* the assistant text of one turn */
#define ACP_STDERR_LOG_MAX ((size_t)64 * 1024)  /* bytes of the child's stderr logged per run */
#define ACP_STDERR_LINE_MAX 512                 /* longer stderr lines are cut in the log */
#define ACP_LAST_ERR_MAX 240                    /* the last stderr line quoted in error messages */
#define ACP_DEFAULT_HANDSHAKE_MS 30000u         /* spawn → session/new answered */
#define ACP_CANCEL_WAIT_MS 1000u                /* session/cancel → the prompt's answer, at most */
#define ACP_EOF_GRACE_MS 1000u                  /* stdin EOF → SIGTERM */
#define ACP_KILL_GRACE_MS 2000u                 /* SIGTERM → SIGKILL (api->process_kill) */
#define ACP_OUTPUT_EOF_WAIT_MS 500u             /* stdout EOF → the exit, before failing without it */
#define ACP_STDERR_DRAIN_MS 1000u               /* the exit → the end of stderr, at most */
/* While the plugin is withdrawn the host waits for done() a bounded time (2 s by default), so the
 * escalation is shortened: EOF → SIGTERM after 300 ms → SIGKILL after 700 ms, stderr drained 200 ms. */
#define ACP_WITHDRAW_EOF_GRACE_MS 300u
#define ACP_WITHDRAW_KILL_GRACE_MS 700u
#define ACP_WITHDRAW_STDERR_DRAIN_MS 200u
#define ACP_MAX_LIST 256 /* items in args / env / pass_env */

typedef enum acp_phase {
  ACP_PHASE_INVALID = 0,
  ACP_PHASE_START,
  ACP_PHASE_INIT,
  ACP_PHASE_SESSION,
  ACP_PHASE_PROMPT,
  ACP_PHASE_DONE,
} acp_phase;

typedef struct acp_link {
  struct acp_link *prev;
  struct acp_link *next;
} acp_link;

struct acp_child {
  ah_mount *m;
  const ah_host_api *api;
  ah_provider prov; /* registered; prov.data = this */
  acp_link runs;    /* every run not yet freed, also after the host's turn_free */
  uint64_t next_run;
  bool withdrawing;
  void (*done)(void *arg);
  void *done_arg;
  uv_idle_t closer; /* its close callback reports done (see acp_child_finish) */
};

/* One turn = one child. The struct is the provider's turn handle. */
struct ah_provider_turn {
  acp_link link; /* first: the list's entries are runs */
  acp_child *c;
  uint64_t id; /* lifecycle id, unique per mount: "run N" in every log line */
  char *provider;
  char *session;
  ah_turn_sink sink; /* copied */
  void *ctx;
  acp_phase phase;
  int depth;       /* > 0 while one of our functions runs: the run is not freed under it */
  bool host_freed; /* turn_free() was called */
  bool ended;      /* end() was reported (or the host freed the turn first): no more sink calls */
  bool cancel_requested;
  bool cancel_sent; /* session/cancel went out (once) */
  bool prompt_outstanding;
  bool disposing;
  bool exited;
  bool peer_closing;
  bool killing;  /* api->process_kill() was called */
  bool err_open; /* our stderr handle is open */
  bool err_closing;

  /* What turn_start prepared. */
  char *file;
  char **argv;
  char **envv;
  char *cwd;
  json_t *prompt; /* the ACP content blocks */
  uint64_t handshake_ms;
  char *fail_msg; /* set by turn_start: the turn ends `error` with it, nothing spawned */

  /* The child. */
  ah_process *proc;
  int pid;
  ah_rpc_peer *peer;
  char *acp_session; /* the child's sessionId */
  int64_t exit_status;
  int term_signal;

  /* Output. */
  char *text;
  size_t text_len;
  size_t text_cap;

  /* A permission request of the child waiting for the user's answer. */
  ah_rpc_inbound *perm;
  json_t *perm_options; /* the child's options (an array of {optionId, name, kind}) */

  /* Host timers (one-shot; NULL when not armed). */
  ah_timer *t_kick;      /* a deferred end */
  ah_timer *t_handshake; /* the handshake's deadline */
  ah_timer *t_cancel;    /* the wait for the prompt's answer after session/cancel */
  ah_timer *t_grace;     /* stdin EOF → process_kill */
  ah_timer *t_eof;       /* stdout EOF → exit */
  ah_timer *t_errdrain;  /* exit → stderr closed */
  char *kick_reason;
  char *kick_error;

  /* stderr. */
  uv_pipe_t errpipe;
  char errbuf[4096];
  char errline[ACP_STDERR_LINE_MAX + 1];
  size_t errline_len;
  bool errline_cut;
  size_t err_logged;
  bool err_capped;
  char last_err[ACP_LAST_ERR_MAX + 1];
};

typedef ah_provider_turn acp_run;

static void run_dispose(acp_run *r);
static void run_maybe_free(acp_run *r);

/* ---- small helpers ------------------------------------------------------------------------------------ */

static void list_init(acp_link *l) {
  l->prev = l->next = l;
}

static void list_push(acp_link *head, acp_link *l) {
  l->prev = head->prev;
  l->next = head;
  head->prev->next = l;
  head->prev = l;
}

static void list_remove(acp_link *l) {
  l->prev->next = l->next;
  l->next->prev = l->prev;
  l->prev = l->next = l;
}

static char *acp_strdup(const char *s) {
  return s ? strdup(s) : NULL;
}

static void strv_free(char **v) {
  for (char **p = v; p && *p; p++)
    free(*p);
  free(v);
}

/* printf into a new string (NULL when out of memory). */
__attribute__((format(printf, 1, 2))) static char *acp_fmt(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0)
    return NULL;
  char *s = malloc((size_t)n + 1);
  if (!s)
    return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

#define RLOG(r, level, fmt, ...)                                                   \
  (r)->c->api->log((r)->c->m, (level), "run %llu (provider %s, session %s): " fmt, \
                   (unsigned long long)(r)->id, (r)->provider, (r)->session, ##__VA_ARGS__)

static void timer_clear(acp_run *r, ah_timer **t) {
  if (*t) {
    r->c->api->timer_stop(*t);
    *t = NULL;
  }
}

/* A short, printable form of a JSON-RPC error object from the child: "message (code N)". */
static char *rpc_error_text(const json_t *error) {
  const char *msg = json_string_value(json_object_get(error, "message"));
  const json_t *code = json_object_get(error, "code");
  if (!msg)
    msg = "no message";
  if (json_is_integer(code))
    return acp_fmt("%.300s (code %lld)", msg, (long long)json_integer_value(code));
  return acp_fmt("%.300s", msg);
}

/* ---- the configuration -------------------------------------------------------------------------------- */

static const char *cfg_str(const json_t *cfg, const char *key) {
  return json_string_value(json_object_get(cfg, key));
}

static bool blank(char ch) {
  return ch == ' ' || ch == '\t';
}

/* Split a comma-separated list: items are trimmed of blanks; "\," is a comma, "\\" a backslash and "\ " a
 * space kept even at an item's edge; a backslash before any other character stays as it is. A blank value is
 * an empty list; an empty item is an error. Returns a NULL-terminated vector, or NULL with *err set. */
static char **split_list(const char *s, const char *key, char **err) {
  char **v = calloc(ACP_MAX_LIST + 1, sizeof *v);
  size_t n = 0;
  size_t len = strlen(s);
  char *item = malloc(len + 1);
  if (!v || !item) {
    free(v);
    free(item);
    *err = acp_fmt("out of memory");
    return NULL;
  }
  bool all_blank = true;
  for (size_t i = 0; i < len; i++)
    all_blank = all_blank && blank(s[i]);
  if (all_blank) {
    free(item);
    return v;
  }
  const char *p = s;
  for (;;) {
    size_t k = 0;
    size_t keep = 0; /* item length up to its last escaped or non-blank character */
    while (*p && blank(*p))
      p++;
    while (*p && *p != ',') {
      if (*p == '\\' && (p[1] == ',' || p[1] == '\\' || p[1] == ' ')) {
        item[k++] = p[1];
        keep = k;
        p += 2;
        continue;
      }
      item[k++] = *p;
      if (!blank(*p))
        keep = k;
      p++;
    }
    item[keep] = '\0';
    if (keep == 0) {
      *err = acp_fmt("%s: an empty item in the comma-separated list", key);
      goto fail;
    }
    if (n == ACP_MAX_LIST) {
      *err = acp_fmt("%s: more than %d items", key, ACP_MAX_LIST);
      goto fail;
    }
    if (!(v[n++] = strdup(item))) {
      *err = acp_fmt("out of memory");
      goto fail;
    }
    if (!*p)
      break;
    p++; /* the comma */
  }
  free(item);
  return v;
fail:
  free(item);
  strv_free(v);
  return NULL;
}

static bool parse_ms(const char *s, uint64_t *out) {
  if (!s || !*s || strlen(s) > 9)
    return false;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return false;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (v == 0)
    return false;
  *out = v;
  return true;
}

/* Read [provider.NAME] into the run: file, argv, envv, cwd, handshake_ms. Returns NULL or an error message
 * (malloc'ed) that names the key. */
static char *read_config(acp_run *r, const json_t *cfg, const char *session_cwd) {
  char *err = NULL;
  const char *command = cfg_str(cfg, "command");
  if (!command || !*command)
    return acp_fmt("[provider.%s] command is required (the ACP agent's program)", r->provider);
  if (strchr(command, '/') && command[0] != '/')
    return acp_fmt("[provider.%s] command \"%s\": a program name looked up in PATH or an absolute path is "
                   "required",
                   r->provider, command);
  r->file = strdup(command);
  char **args = split_list(cfg_str(cfg, "args") ? cfg_str(cfg, "args") : "", "args", &err);
  if (!args)
    return err;
  size_t nargs = 0;
  while (args[nargs])
    nargs++;
  r->argv = calloc(nargs + 2, sizeof *r->argv);
  if (!r->argv || !r->file) {
    strv_free(args);
    return acp_fmt("out of memory");
  }
  r->argv[0] = strdup(command);
  for (size_t i = 0; i < nargs; i++)
    r->argv[i + 1] = args[i];
  free(args); /* the strings moved to argv */
  if (!r->argv[0])
    return acp_fmt("out of memory");

  /* Environment: env = NAME=value, ... and pass_env = NAME, ... (copied from the host's environment when
   * set). Values starting with "()" (exported shell functions) are dropped here and by api->spawn. */
  char **env = split_list(cfg_str(cfg, "env") ? cfg_str(cfg, "env") : "", "env", &err);
  if (!env)
    return err;
  char **pass = split_list(cfg_str(cfg, "pass_env") ? cfg_str(cfg, "pass_env") : "", "pass_env", &err);
  if (!pass) {
    strv_free(env);
    return err;
  }
  size_t nenv = 0, npass = 0;
  while (env[nenv])
    nenv++;
  while (pass[npass])
    npass++;
  r->envv = calloc(nenv + npass + 1, sizeof *r->envv);
  size_t k = 0;
  for (size_t i = 0; r->envv && i < nenv && !err; i++) {
    const char *eq = strchr(env[i], '=');
    if (!eq || !env_name_valid(env[i], (size_t)(eq - env[i]))) {
      err = acp_fmt("[provider.%s] env: \"%.100s\" is not NAME=value (NAME: [A-Za-z_][A-Za-z0-9_]*)",
                    r->provider, env[i]);
    } else if (strncmp(eq + 1, "()", 2) == 0) {
      RLOG(r, AH_PLOG_WARN, "env: %.*s dropped (its value starts with \"()\")", (int)(eq - env[i]), env[i]);
    } else {
      r->envv[k++] = env[i];
      env[i] = NULL;
    }
  }
  for (size_t i = 0; r->envv && i < npass && !err; i++) {
    if (!env_name_valid(pass[i], strlen(pass[i]))) {
      err = acp_fmt("[provider.%s] pass_env: \"%.100s\" is not a variable name", r->provider, pass[i]);
      break;
    }
    const char *val = getenv(pass[i]);
    if (!val)
      continue;
    if (strncmp(val, "()", 2) == 0) {
      RLOG(r, AH_PLOG_WARN, "pass_env: %s dropped (its value starts with \"()\")", pass[i]);
      continue;
    }
    if (!(r->envv[k++] = acp_fmt("%s=%s", pass[i], val)))
      err = acp_fmt("out of memory");
  }
  for (size_t i = 0; i < nenv; i++)
    free(env[i]);
  free(env);
  strv_free(pass);
  if (!r->envv && !err)
    err = acp_fmt("out of memory");
  if (err)
    return err;

  /* cwd: the configured one, else the session's; never the host's own. */
  const char *cwd = cfg_str(cfg, "cwd");
  const char *from = "[provider] cwd";
  if (!cwd || !*cwd) {
    cwd = session_cwd;
    from = "the session's cwd";
  }
  if (!cwd || cwd[0] != '/')
    return acp_fmt("the ACP agent's working directory (%s) \"%s\" is not an absolute path", from,
                   cwd ? cwd : "(none)");
  struct stat st;
  if (stat(cwd, &st) != 0)
    return acp_fmt("the ACP agent's working directory (%s) \"%s\" does not exist: %s", from, cwd,
                   strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return acp_fmt("the ACP agent's working directory (%s) \"%s\" is not a directory", from, cwd);
  r->cwd = strdup(cwd);

  const char *hs = cfg_str(cfg, "handshake_timeout_ms");
  r->handshake_ms = ACP_DEFAULT_HANDSHAKE_MS;
  if (hs && !parse_ms(hs, &r->handshake_ms))
    return acp_fmt("[provider.%s] handshake_timeout_ms: a positive number of milliseconds is required, got "
                   "\"%.40s\"",
                   r->provider, hs);
  return r->cwd ? NULL : acp_fmt("out of memory");
}

/* The new user message as ACP content blocks: text and resource_link (the only kinds the core stores). */
static json_t *acp_prompt_blocks(const json_t *content) {
  json_t *out = json_array();
  size_t i = 0;
  const json_t *b = NULL;
  json_array_foreach(content, i, b) {
    const char *type = json_string_value(json_object_get(b, "type"));
    if (!type)
      continue;
    if (strcmp(type, "text") == 0 && json_is_string(json_object_get(b, "text"))) {
      json_array_append_new(out, json_pack("{s:s, s:O}", "type", "text", "text", json_object_get(b, "text")));
    } else if (strcmp(type, "resource_link") == 0 && json_is_string(json_object_get(b, "uri"))) {
      const json_t *name = json_object_get(b, "name");
      json_t *link = json_pack("{s:s, s:O, s:O}", "type", "resource_link", "uri", json_object_get(b, "uri"),
                               "name", json_is_string(name) ? name : json_object_get(b, "uri"));
      static const char *const opt_str[] = {"mimeType", "title", "description"};
      for (size_t k = 0; link && k < sizeof opt_str / sizeof opt_str[0]; k++)
        if (json_is_string(json_object_get(b, opt_str[k])))
          json_object_set(link, opt_str[k], json_object_get(b, opt_str[k]));
      if (link && json_is_integer(json_object_get(b, "size")))
        json_object_set(link, "size", json_object_get(b, "size"));
      json_array_append_new(out, link);
    }
  }
  if (out && json_array_size(out) == 0) {
    json_decref(out);
    return NULL;
  }
  return out;
}

/* ---- ending a turn ------------------------------------------------------------------------------------ */

/* Report the end (once): the text so far is committed when there is any, then end(). Then dispose. Never
 * called from inside a call the host makes into the provider. */
static void run_finish(acp_run *r, const char *reason, const char *error) {
  r->depth++;
  if (!r->ended) {
    r->ended = true;
    r->phase = ACP_PHASE_DONE;
    if (strcmp(reason, "error") == 0)
      RLOG(r, AH_PLOG_WARN, "ended error: %s", error ? error : "(no message)");
    else
      RLOG(r, AH_PLOG_INFO, "ended %s (%zu bytes of text)", reason, r->text_len);
    if (r->text_len > 0 && !r->host_freed)
      r->sink.commit(r->ctx, r->text);
    if (!r->host_freed)
      r->sink.end(r->ctx, reason, NULL, error);
  }
  run_dispose(r);
  r->depth--;
  run_maybe_free(r);
}

static void on_kick(ah_timer *t, void *arg) {
  (void)t;
  acp_run *r = arg;
  r->t_kick = NULL;
  char *reason = r->kick_reason;
  char *error = r->kick_error;
  r->kick_reason = r->kick_error = NULL;
  run_finish(r, reason ? reason : "error", error ? error : (reason ? NULL : "out of memory"));
  free(reason);
  free(error);
}

/* End the turn on a later loop turn (from inside a host call). The first deferred end wins. */
static void run_defer_end(acp_run *r, const char *reason, const char *error) {
  if (r->ended || r->t_kick)
    return;
  r->kick_reason = acp_strdup(reason);
  r->kick_error = acp_strdup(error);
  if (r->c->api->timer_start(r->c->m, 0, 0, on_kick, r, &r->t_kick) != 0) {
    /* No timer (the mount is withdrawing): the host ends the turn itself; reclaim the child. */
    r->t_kick = NULL;
    r->ended = true;
    run_dispose(r);
  }
}

/* ---- the child's output ------------------------------------------------------------------------------- */

static bool text_append(acp_run *r, const char *s, size_t n) {
  if (r->text_len + n + 1 > r->text_cap) {
    size_t cap = r->text_cap ? r->text_cap : 256;
    while (cap < r->text_len + n + 1)
      cap *= 2;
    char *d = realloc(r->text, cap);
    if (!d)
      return false;
    r->text = d;
    r->text_cap = cap;
  }
  memcpy(r->text + r->text_len, s, n);
  r->text_len += n;
  r->text[r->text_len] = '\0';
  return true;
}

static void on_update(acp_run *r, const json_t *params) {
  if (r->phase != ACP_PHASE_PROMPT || r->ended)
    return;
  const char *sid = json_string_value(json_object_get(params, "sessionId"));
  const json_t *u = json_object_get(params, "update");
  const char *kind = json_string_value(json_object_get(u, "sessionUpdate"));
  if (!sid || strcmp(sid, r->acp_session) != 0 || !kind) {
    RLOG(r, AH_PLOG_DEBUG, "ignored a malformed session/update");
    return;
  }
  if (strcmp(kind, "agent_message_chunk") != 0) {
    /* Thoughts, plans, the child's own tool calls, modes, usage: not shown (documented). */
    RLOG(r, AH_PLOG_DEBUG, "ignored session/update %.40s", kind);
    return;
  }
  const json_t *content = json_object_get(u, "content");
  const char *type = json_string_value(json_object_get(content, "type"));
  const json_t *text = json_object_get(content, "text");
  if (!type || strcmp(type, "text") != 0 || !json_is_string(text)) {
    RLOG(r, AH_PLOG_DEBUG, "ignored a non-text agent_message_chunk");
    return;
  }
  /* A string with an embedded NUL is kept up to it, in the deltas and in the commit alike. */
  size_t n = strlen(json_string_value(text));
  if (n == 0)
    return;
  if (n > ACP_MAX_TEXT - r->text_len || !text_append(r, json_string_value(text), n)) {
    run_finish(r, "error", "the ACP agent's answer exceeds the size limit (16 MiB)");
    return;
  }
  r->sink.delta(r->ctx, json_string_value(text));
}

static const char *map_stop_reason(const char *s) {
  if (!s)
    return NULL;
  if (strcmp(s, "end_turn") == 0)
    return "end";
  if (strcmp(s, "max_tokens") == 0 || strcmp(s, "max_turn_requests") == 0)
    return "max-tokens";
  if (strcmp(s, "refusal") == 0)
    return "refusal";
  if (strcmp(s, "cancelled") == 0)
    return "cancelled";
  return NULL;
}

static void on_prompt_answer(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                             void *arg) {
  (void)peer;
  acp_run *r = arg;
  r->prompt_outstanding = false;
  if (r->ended || status == AH_ECLOSED)
    return; /* the exit (or the dispose in progress) reports */
  if (r->cancel_requested) {
    run_finish(r, "cancelled", NULL);
    return;
  }
  if (status != 0) {
    char *e = rpc_error_text(error);
    char *msg = acp_fmt("the ACP agent failed the prompt: %s", e ? e : "error");
    run_finish(r, "error", msg ? msg : "the ACP agent failed the prompt");
    free(e);
    free(msg);
    return;
  }
  const char *stop = json_string_value(json_object_get(result, "stopReason"));
  const char *reason = map_stop_reason(stop);
  if (!reason) {
    char *msg = acp_fmt("the ACP agent answered the prompt with an unknown stopReason%s%.60s%s",
                        stop ? " \"" : "", stop ? stop : "", stop ? "\"" : " (missing)");
    run_finish(r, "error", msg ? msg : "unknown stopReason");
    free(msg);
    return;
  }
  run_finish(r, reason, NULL);
}

/* ---- the handshake ------------------------------------------------------------------------------------ */

static void handshake_fail(acp_run *r, const char *step, const json_t *error, const char *why) {
  char *e = error ? rpc_error_text(error) : NULL;
  char *msg = acp_fmt("the ACP agent failed %s: %s", step, e ? e : why);
  run_finish(r, "error", msg ? msg : "the ACP agent failed the handshake");
  free(e);
  free(msg);
}

static void send_prompt(acp_run *r) {
  json_t *params = json_pack("{s:s, s:O}", "sessionId", r->acp_session, "prompt", r->prompt);
  int rc = r->c->api->rpc->request(r->peer, "session/prompt", params, on_prompt_answer, r, NULL);
  if (rc) {
    run_finish(r, "error", "cannot send session/prompt to the ACP agent");
    return;
  }
  r->prompt_outstanding = true;
}

static void on_session_new(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                           void *arg) {
  (void)peer;
  acp_run *r = arg;
  if (r->ended || status == AH_ECLOSED || r->phase != ACP_PHASE_SESSION)
    return;
  if (status != 0) {
    handshake_fail(r, "session/new", error, "error");
    return;
  }
  const char *sid = json_string_value(json_object_get(result, "sessionId"));
  if (!sid || !*sid || strlen(sid) > 1024) {
    handshake_fail(r, "session/new", NULL, "the answer has no sessionId string");
    return;
  }
  if (!(r->acp_session = strdup(sid))) {
    run_finish(r, "error", "out of memory");
    return;
  }
  timer_clear(r, &r->t_handshake);
  r->phase = ACP_PHASE_PROMPT;
  RLOG(r, AH_PLOG_INFO, "ready: pid %d, ACP session %.100s", r->pid, sid);
  send_prompt(r);
}

static void on_initialize(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                          void *arg) {
  (void)peer;
  acp_run *r = arg;
  if (r->ended || status == AH_ECLOSED || r->phase != ACP_PHASE_INIT)
    return;
  if (status != 0) {
    handshake_fail(r, "initialize", error, "error");
    return;
  }
  const json_t *v = json_object_get(result, "protocolVersion");
  if (!json_is_integer(v)) {
    handshake_fail(r, "initialize", NULL, "the answer has no integer protocolVersion");
    return;
  }
  if (json_integer_value(v) != ACP_PROTOCOL_VERSION) {
    char *why = acp_fmt("it speaks ACP protocol version %lld, agenthost speaks %d",
                        (long long)json_integer_value(v), ACP_PROTOCOL_VERSION);
    handshake_fail(r, "initialize", NULL, why ? why : "unsupported protocol version");
    free(why);
    return;
  }
  r->phase = ACP_PHASE_SESSION;
  json_t *params = json_pack("{s:s, s:[]}", "cwd", r->cwd, "mcpServers");
  if (r->c->api->rpc->request(r->peer, "session/new", params, on_session_new, r, NULL) != 0)
    run_finish(r, "error", "cannot send session/new to the ACP agent");
}

static void on_handshake_timeout(ah_timer *t, void *arg) {
  (void)t;
  acp_run *r = arg;
  r->t_handshake = NULL;
  char *msg =
      acp_fmt("the ACP agent did not answer %s within %llu ms",
              r->phase == ACP_PHASE_INIT ? "initialize" : "session/new", (unsigned long long)r->handshake_ms);
  run_finish(r, "error", msg ? msg : "the ACP agent did not complete the handshake");
  free(msg);
}

/* ---- requests and notifications from the child -------------------------------------------------------- */

static void answer_perm(acp_run *r, const char *option_id) {
  ah_rpc_inbound *req = r->perm;
  if (!req)
    return;
  r->perm = NULL;
  json_decref(r->perm_options);
  r->perm_options = NULL;
  json_t *outcome = option_id
                        ? json_pack("{s:{s:s, s:s}}", "outcome", "outcome", "selected", "optionId", option_id)
                        : json_pack("{s:{s:s}}", "outcome", "outcome", "cancelled");
  r->c->api->rpc->respond(req, outcome);
}

static void on_permission(acp_run *r, ah_rpc_inbound *req, const json_t *params) {
  const ah_rpc_api *rpc = r->c->api->rpc;
  const char *sid = json_string_value(json_object_get(params, "sessionId"));
  const json_t *options = json_object_get(params, "options");
  const json_t *tool = json_object_get(params, "toolCall");
  bool ok = sid && json_is_array(options) && json_array_size(options) > 0 && json_is_object(tool);
  size_t i = 0;
  const json_t *o = NULL;
  json_array_foreach(options, i, o) {
    ok = ok && json_is_string(json_object_get(o, "optionId")) && json_is_string(json_object_get(o, "name"));
  }
  if (!ok) {
    rpc->respond_error(req, AH_RPC_INVALID_PARAMS,
                       "session/request_permission: sessionId, toolCall and options "
                       "[{optionId, name, kind}] are required",
                       NULL);
    return;
  }
  /* Cancellation never grants: outside a live prompt, or with another request pending, the answer is
   * `cancelled` at once. */
  if (strcmp(sid, r->acp_session ? r->acp_session : "") != 0 || r->phase != ACP_PHASE_PROMPT || r->ended ||
      r->cancel_requested || r->perm || !r->sink.ask) {
    rpc->respond(req, json_pack("{s:{s:s}}", "outcome", "outcome", "cancelled"));
    return;
  }
  const char *title = json_string_value(json_object_get(tool, "title"));
  const char *call_id = json_string_value(json_object_get(tool, "toolCallId"));
  char *question = acp_fmt("The ACP agent asks permission: %.500s", title     ? title
                                                                    : call_id ? call_id
                                                                              : "(a tool call)");
  json_t *names = json_array();
  json_array_foreach(options, i, o) {
    json_array_append(names, json_object_get(o, "name"));
  }
  r->perm = req;
  r->perm_options = json_deep_copy(options);
  if (!question || !names || !r->perm_options) {
    answer_perm(r, NULL);
  } else {
    RLOG(r, AH_PLOG_INFO, "permission asked: %.200s", question);
    /* turn_answer may run inside ask (the host refuses at once): answer_perm handles both orders. */
    r->sink.ask(r->ctx, question, names);
  }
  free(question);
  json_decref(names);
}

static void on_request(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  (void)peer;
  acp_run *r = data;
  r->depth++;
  if (strcmp(method, "session/request_permission") == 0) {
    on_permission(r, req, params);
  } else {
    /* The fs and terminal methods are not advertised (clientCapabilities false); nothing else is a client
     * method. */
    RLOG(r, AH_PLOG_DEBUG, "refused request %.60s (not supported)", method);
    r->c->api->rpc->respond_error(req, AH_RPC_METHOD_NOT_FOUND, "method not found", NULL);
  }
  r->depth--;
  run_maybe_free(r);
}

static void on_notification(ah_rpc_peer *peer, const char *method, const json_t *params, void *data) {
  (void)peer;
  acp_run *r = data;
  r->depth++;
  if (strcmp(method, "session/update") == 0 && json_is_object(params))
    on_update(r, params);
  else
    RLOG(r, AH_PLOG_DEBUG, "ignored notification %.60s", method);
  r->depth--;
  run_maybe_free(r);
}

static void on_rpc_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  acp_run *r = data;
  RLOG(r, AH_PLOG_WARN, "ACP agent's output: %s", msg);
}

static void on_output_eof_timeout(ah_timer *t, void *arg) {
  (void)t;
  acp_run *r = arg;
  r->t_eof = NULL;
  run_finish(r, "error", "the ACP agent closed its output (stdout) and did not exit");
}

static void on_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  (void)status;
  acp_run *r = data;
  /* The exit usually follows at once and says more (status, signal): wait for it a little. */
  if (r->ended || r->exited || r->t_eof)
    return;
  if (r->c->api->timer_start(r->c->m, ACP_OUTPUT_EOF_WAIT_MS, 0, on_output_eof_timeout, r, &r->t_eof) != 0) {
    r->t_eof = NULL;
    run_finish(r, "error", "the ACP agent closed its output (stdout)");
  }
}

/* ---- stderr ------------------------------------------------------------------------------------------- */

static void err_flush_line(acp_run *r) {
  if (r->errline_len == 0 && !r->errline_cut)
    return;
  r->errline[r->errline_len] = '\0';
  if (r->errline_len > 0) {
    size_t keep = r->errline_len < ACP_LAST_ERR_MAX ? r->errline_len : ACP_LAST_ERR_MAX;
    memcpy(r->last_err, r->errline, keep);
    r->last_err[keep] = '\0';
    if (!r->err_capped) {
      if (r->err_logged + r->errline_len > ACP_STDERR_LOG_MAX) {
        r->err_capped = true;
        RLOG(r, AH_PLOG_WARN, "stderr: more than %zu bytes; the rest is not logged", ACP_STDERR_LOG_MAX);
      } else {
        r->err_logged += r->errline_len;
        RLOG(r, AH_PLOG_INFO, "stderr: %s%s", r->errline, r->errline_cut ? " [cut]" : "");
      }
    }
  }
  r->errline_len = 0;
  r->errline_cut = false;
}

static void err_closed(uv_handle_t *h) {
  acp_run *r = h->data;
  r->err_open = false;
  run_maybe_free(r);
}

static void err_close(acp_run *r) {
  if (!r->err_open || r->err_closing)
    return;
  r->err_closing = true;
  err_flush_line(r);
  uv_close((uv_handle_t *)&r->errpipe, err_closed);
}

static void err_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  acp_run *r = h->data;
  *buf = uv_buf_init(r->errbuf, (unsigned int)sizeof r->errbuf);
}

static void err_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  acp_run *r = s->data;
  if (nread < 0) {
    err_close(r);
    return;
  }
  for (ssize_t i = 0; i < nread; i++) {
    char ch = buf->base[i];
    if (ch == '\n') {
      err_flush_line(r);
    } else if (r->errline_len < ACP_STDERR_LINE_MAX) {
      r->errline[r->errline_len++] = ch;
    } else {
      r->errline_cut = true;
    }
  }
}

static void on_errdrain(ah_timer *t, void *arg) {
  (void)t;
  acp_run *r = arg;
  r->t_errdrain = NULL;
  err_close(r); /* a descendant keeps stderr open: stop listening */
}

/* Read the child's stderr on a handle of our own (a duplicate of the descriptor; see the file comment). */
static void err_start(acp_run *r) {
  uv_stream_t *s = r->c->api->process_stderr(r->proc);
  uv_os_fd_t fd = -1;
  if (!s || uv_fileno((uv_handle_t *)s, &fd) != 0)
    return;
  int dupfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (dupfd < 0)
    return;
  uv_loop_t *loop = r->c->api->loop(r->c->m);
  if (uv_pipe_init(loop, &r->errpipe, 0) != 0) {
    close(dupfd);
    return;
  }
  r->errpipe.data = r;
  r->err_open = true;
  if (uv_pipe_open(&r->errpipe, dupfd) != 0) {
    close(dupfd);
    err_close(r);
    return;
  }
  if (uv_read_start((uv_stream_t *)&r->errpipe, err_alloc, err_read) != 0)
    err_close(r);
}

/* ---- the process -------------------------------------------------------------------------------------- */

static void on_peer_closed(ah_rpc_peer *peer, void *arg) {
  (void)peer;
  acp_run *r = arg;
  r->peer = NULL;
  /* Everything written is flushed: now stdin EOF (the first step of the escalation). */
  if (r->proc && !r->exited)
    r->c->api->process_close_stdin(r->proc);
  run_maybe_free(r);
}

static void peer_close(acp_run *r) {
  if (!r->peer || r->peer_closing)
    return;
  r->peer_closing = true;
  if (r->c->api->rpc->close(r->peer, on_peer_closed, r) != 0)
    r->peer = NULL;
}

static void on_exit_cb(ah_process *proc, int64_t exit_status, int term_signal, void *arg) {
  (void)proc;
  acp_run *r = arg;
  r->depth++;
  r->exited = true;
  r->exit_status = exit_status;
  r->term_signal = term_signal;
  timer_clear(r, &r->t_grace);
  timer_clear(r, &r->t_eof);
  timer_clear(r, &r->t_handshake);
  RLOG(r, AH_PLOG_INFO, "child %d exited (%s %d)", r->pid, term_signal ? "signal" : "status",
       term_signal ? term_signal : (int)exit_status);
  /* Members of the child's process group that outlived it are not left behind. The group id stays
   * allocated (and so cannot name another group) while any member lives. */
  if (r->pid > 0 && kill(-r->pid, 0) == 0) {
    RLOG(r, AH_PLOG_INFO, "killing what is left of process group %d", r->pid);
    kill(-r->pid, SIGKILL);
  }
  /* The pipes are freed after this callback: the peer stops touching them now. */
  peer_close(r);
  r->proc = NULL;
  if (r->err_open && !r->t_errdrain &&
      r->c->api->timer_start(r->c->m, r->c->withdrawing ? ACP_WITHDRAW_STDERR_DRAIN_MS : ACP_STDERR_DRAIN_MS,
                             0, on_errdrain, r, &r->t_errdrain) != 0) {
    r->t_errdrain = NULL;
    err_close(r);
  }
  if (!r->ended) {
    const char *during = r->phase == ACP_PHASE_INIT      ? "during initialize"
                         : r->phase == ACP_PHASE_SESSION ? "during session/new"
                                                         : "during the prompt";
    err_flush_line(r);
    char *msg = acp_fmt("the ACP agent exited (%s %d) %s%s%s", term_signal ? "signal" : "status",
                        term_signal ? term_signal : (int)exit_status, during,
                        r->last_err[0] ? "; its last stderr line: " : "", r->last_err);
    run_finish(r, r->cancel_requested ? "cancelled" : "error", r->cancel_requested ? NULL : msg);
    free(msg);
  }
  r->depth--;
  run_maybe_free(r);
}

static void on_grace(ah_timer *t, void *arg) {
  (void)t;
  acp_run *r = arg;
  r->t_grace = NULL;
  if (!r->proc || r->exited)
    return;
  bool w = r->c->withdrawing;
  RLOG(r, AH_PLOG_INFO, "child %d still running %u ms after stdin EOF: SIGTERM, SIGKILL after %u ms", r->pid,
       w ? ACP_WITHDRAW_EOF_GRACE_MS : ACP_EOF_GRACE_MS, w ? ACP_WITHDRAW_KILL_GRACE_MS : ACP_KILL_GRACE_MS);
  r->c->api->process_close_stdin(r->proc); /* in case the flush never ended */
  r->killing = true;
  r->c->api->process_kill(r->proc, w ? ACP_WITHDRAW_KILL_GRACE_MS : ACP_KILL_GRACE_MS);
}

/* Reclaim the child (once): cancel once, answer what waits, close the peer (stdin EOF follows), then the
 * escalation. Ends only when on_exit ran. */
static void run_dispose(acp_run *r) {
  if (r->disposing)
    return;
  r->disposing = true;
  r->depth++;
  timer_clear(r, &r->t_handshake);
  timer_clear(r, &r->t_cancel);
  timer_clear(r, &r->t_eof);
  answer_perm(r, NULL);
  if (r->proc && !r->exited) {
    if (r->peer && r->acp_session && r->prompt_outstanding && !r->cancel_sent) {
      r->cancel_sent = true;
      r->c->api->rpc->notify(r->peer, "session/cancel", json_pack("{s:s}", "sessionId", r->acp_session));
    }
    if (r->peer)
      peer_close(r);
    else
      r->c->api->process_close_stdin(r->proc);
    if (r->c->api->timer_start(r->c->m, r->c->withdrawing ? ACP_WITHDRAW_EOF_GRACE_MS : ACP_EOF_GRACE_MS, 0,
                               on_grace, r, &r->t_grace) != 0) {
      r->t_grace = NULL;
      r->killing = true;
      r->c->api->process_kill(r->proc, ACP_KILL_GRACE_MS);
    }
  } else {
    peer_close(r);
  }
  r->depth--;
}

static void closer_closed(uv_handle_t *h) {
  acp_child *c = h->data;
  void (*done)(void *) = c->done;
  void *arg = c->done_arg;
  free(c);
  done(arg);
}

/* The last run of a withdraw is gone: report done from a close callback of our own, so that it never runs
 * inside a host callback (on_exit, a timer) whose object the host still holds. */
static void acp_child_finish(acp_child *c) {
  uv_idle_init(c->api->loop(c->m), &c->closer);
  c->closer.data = c;
  uv_close((uv_handle_t *)&c->closer, closer_closed);
}

static void run_free(acp_run *r) {
  acp_child *c = r->c;
  timer_clear(r, &r->t_kick);
  timer_clear(r, &r->t_handshake);
  timer_clear(r, &r->t_cancel);
  timer_clear(r, &r->t_grace);
  timer_clear(r, &r->t_eof);
  timer_clear(r, &r->t_errdrain);
  list_remove(&r->link);
  free(r->provider);
  free(r->session);
  free(r->file);
  strv_free(r->argv);
  strv_free(r->envv);
  free(r->cwd);
  json_decref(r->prompt);
  free(r->fail_msg);
  free(r->acp_session);
  free(r->text);
  json_decref(r->perm_options);
  free(r->kick_reason);
  free(r->kick_error);
  free(r);
  if (c->withdrawing && c->runs.next == &c->runs)
    acp_child_finish(c);
}

/* Free the run once nothing refers to it any more: the host freed its turn, the child is reclaimed and
 * gone, the peer and the stderr handle are closed, and none of our functions is on the stack. */
static void run_maybe_free(acp_run *r) {
  if (r->depth > 0 || !r->host_freed || !r->disposing || r->proc || r->peer || r->err_open || r->perm)
    return;
  run_free(r);
}

/* Spawn and start the handshake. On failure the run's fail_msg is set. */
static void run_spawn(acp_run *r) {
  acp_child *c = r->c;
  ah_process_opts o = {
      .struct_size = sizeof o,
      .file = r->file,
      .args = (const char *const *)r->argv,
      .env = (const char *const *)r->envv,
      .cwd = r->cwd,
      .pipe_stdin = true,
      .pipe_stdout = true,
      .pipe_stderr = true,
      .on_exit = on_exit_cb,
      .arg = r,
  };
  int rc = c->api->spawn(c->m, &o, &r->proc);
  if (rc) {
    r->proc = NULL;
    r->fail_msg = acp_fmt("cannot start the ACP agent \"%s\": %s", r->file,
                          rc == AH_ENOENT ? "no such program (PATH is the host's unless env sets it)"
                                          : ah_strerror(rc));
    return;
  }
  r->pid = c->api->process_pid(r->proc);
  RLOG(r, AH_PLOG_INFO, "spawned %s (pid %d) in %s", r->file, r->pid, r->cwd);
  err_start(r);
  ah_rpc_opts ro = {
      .struct_size = sizeof ro,
      .max_line = ACP_MAX_LINE,
      .on_request = on_request,
      .on_notification = on_notification,
      .on_eof = on_eof,
      .on_log = on_rpc_log,
      .data = r,
  };
  rc = c->api->rpc->open(c->api->process_stdout(r->proc), c->api->process_stdin(r->proc), &ro, &r->peer);
  if (rc) {
    r->peer = NULL;
    r->fail_msg = acp_fmt("cannot talk to the ACP agent: %s", ah_strerror(rc));
    return;
  }
  r->phase = ACP_PHASE_INIT;
  json_t *params =
      json_pack("{s:i, s:{s:{s:b, s:b}, s:b}, s:{s:s, s:s, s:s}}", "protocolVersion", ACP_PROTOCOL_VERSION,
                "clientCapabilities", "fs", "readTextFile", 0, "writeTextFile", 0, "terminal", 0,
                "clientInfo", "name", "agenthost", "title", "agenthost", "version", c->api->host_version());
  if (c->api->rpc->request(r->peer, "initialize", params, on_initialize, r, NULL) != 0) {
    r->fail_msg = acp_fmt("cannot send initialize to the ACP agent");
    return;
  }
  if (c->api->timer_start(c->m, r->handshake_ms, 0, on_handshake_timeout, r, &r->t_handshake) != 0)
    r->t_handshake = NULL;
}

/* ---- the provider ------------------------------------------------------------------------------------- */

static int acp_turn_start(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                          ah_provider_turn **out) {
  if (!p || !p->data || !in || !sink || !out || !AH_HAS_FIELD(in, ah_turn_input, content) ||
      !AH_HAS_FIELD(sink, ah_turn_sink, end) || !sink->delta || !sink->commit || !sink->end ||
      !json_is_array(in->content))
    return AH_EINVAL;
  acp_child *c = p->data;
  if (c->withdrawing)
    return AH_EUNAVAILABLE;
  acp_run *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  r->c = c;
  r->id = ++c->next_run;
  list_init(&r->link);
  size_t sn = sink->struct_size < sizeof r->sink ? sink->struct_size : sizeof r->sink;
  memcpy(&r->sink, sink, sn);
  r->sink.struct_size = (uint32_t)sizeof r->sink;
  r->ctx = ctx;
  r->phase = ACP_PHASE_START;
  bool has_cfg = AH_HAS(in, ah_turn_input, provider_config);
  r->provider = strdup(has_cfg && in->provider_name ? in->provider_name : "acp");
  r->session = strdup(in->session_id ? in->session_id : "-");
  if (!r->provider || !r->session) {
    free(r->provider);
    free(r->session);
    free(r);
    return AH_ENOMEM;
  }
  list_push(&c->runs, &r->link);

  /* Nothing is spawned unless the configuration, the cwd and the message are right. */
  if (!has_cfg)
    r->fail_msg = acp_fmt("this host passes no [provider.NAME] configuration (ABI 1.1 needed)");
  else
    r->fail_msg = read_config(r, in->provider_config, in->cwd);
  if (!r->fail_msg && !(r->prompt = acp_prompt_blocks(in->content)))
    r->fail_msg = acp_fmt("the message has no text or resource_link block to send to the ACP agent");
  if (!r->fail_msg)
    run_spawn(r);
  if (r->fail_msg) {
    RLOG(r, AH_PLOG_WARN, "not started: %s", r->fail_msg);
    run_defer_end(r, "error", r->fail_msg);
  }
  *out = r;
  return 0;
}

static void acp_turn_tool_result(ah_provider_turn *t, const char *call_id, const json_t *result,
                                 bool is_error) {
  (void)t;
  (void)call_id;
  (void)result;
  (void)is_error; /* the child runs its own tools: this provider never asks the host for one */
}

static void acp_turn_subagent_result(ah_provider_turn *t, const char *final_text, const char *reason) {
  (void)t;
  (void)final_text;
  (void)reason; /* never asked for */
}

static void acp_turn_answer(ah_provider_turn *t, const json_t *answer, bool cancelled) {
  if (!t || !t->perm)
    return;
  /* The answer names one of the child's options by its name (as shown) or its optionId; anything else,
   * and a cancellation, is `cancelled`: it never grants. */
  const char *a = cancelled ? NULL : json_string_value(answer);
  const char *chosen = NULL;
  size_t i = 0;
  const json_t *o = NULL;
  json_array_foreach(t->perm_options, i, o) {
    const char *id = json_string_value(json_object_get(o, "optionId"));
    const char *name = json_string_value(json_object_get(o, "name"));
    if (a && !chosen && ((name && strcmp(a, name) == 0) || (id && strcmp(a, id) == 0)))
      chosen = id;
  }
  char *keep = acp_strdup(chosen);
  RLOG(t, AH_PLOG_INFO, "permission answered: %s", keep ? keep : "cancelled");
  answer_perm(t, keep);
  free(keep);
}

static void on_cancel_wait(ah_timer *tm, void *arg) {
  (void)tm;
  acp_run *r = arg;
  r->t_cancel = NULL;
  RLOG(r, AH_PLOG_INFO, "the ACP agent did not answer the cancelled prompt within %u ms", ACP_CANCEL_WAIT_MS);
  run_finish(r, "cancelled", NULL);
}

static void acp_turn_cancel(ah_provider_turn *t) {
  if (!t || t->ended || t->host_freed || t->cancel_requested)
    return;
  t->cancel_requested = true;
  RLOG(t, AH_PLOG_INFO, "cancel requested");
  if (t->phase != ACP_PHASE_PROMPT || !t->prompt_outstanding || !t->peer) {
    /* Before the run was published (or with nothing to wait for): reclaim the child, end `cancelled`. */
    run_defer_end(t, "cancelled", NULL);
    return;
  }
  /* The ACP way: session/cancel, pending permissions answered `cancelled`, then the prompt's answer
   * (`cancelled`) flushes the updates still on their way; it is waited for ACP_CANCEL_WAIT_MS at most. */
  t->cancel_sent = true;
  t->c->api->rpc->notify(t->peer, "session/cancel", json_pack("{s:s}", "sessionId", t->acp_session));
  answer_perm(t, NULL);
  if (t->c->api->timer_start(t->c->m, ACP_CANCEL_WAIT_MS, 0, on_cancel_wait, t, &t->t_cancel) != 0) {
    t->t_cancel = NULL;
    run_defer_end(t, "cancelled", NULL);
  }
}

static void acp_turn_free(ah_provider_turn *t) {
  if (!t || t->host_freed)
    return;
  t->host_freed = true;
  /* Also before end() (the plugin is being withdrawn): no more sink calls. */
  t->ended = true;
  t->depth++;
  run_dispose(t);
  t->depth--;
  run_maybe_free(t);
}

int acp_child_mount(ah_mount *m, const ah_host_api *api, const json_t *config, acp_child **out) {
  (void)config;
  if (!m || !api || !out)
    return AH_EINVAL;
  *out = NULL;
  if (!AH_HAS(api, ah_host_api, register_provider)) {
    api->log(m, AH_PLOG_WARN,
             "the host has no provider registration (ABI 1.1): the acp provider is not offered");
    return 0;
  }
  acp_child *c = calloc(1, sizeof *c);
  if (!c)
    return AH_ENOMEM;
  c->m = m;
  c->api = api;
  list_init(&c->runs);
  c->prov.struct_size = sizeof c->prov;
  c->prov.name = "acp";
  c->prov.turn_start = acp_turn_start;
  c->prov.turn_tool_result = acp_turn_tool_result;
  c->prov.turn_answer = acp_turn_answer;
  c->prov.turn_subagent_result = acp_turn_subagent_result;
  c->prov.turn_cancel = acp_turn_cancel;
  c->prov.turn_free = acp_turn_free;
  c->prov.data = c;
  int rc = api->register_provider(m, &c->prov);
  if (rc) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void acp_child_withdraw(acp_child *c, void (*done)(void *arg), void *arg) {
  if (!c) {
    done(arg);
    return;
  }
  c->withdrawing = true;
  c->done = done;
  c->done_arg = arg;
  if (c->runs.next == &c->runs) {
    free(c);
    done(arg);
    return;
  }
  /* The host has cancelled and freed every turn before withdraw; a run it did not free (it never should)
   * is treated the same way. Each run frees itself once its child is gone; the last one calls done. */
  acp_link *it = c->runs.next;
  while (it != &c->runs) {
    acp_run *r = (acp_run *)it;
    it = it->next;
    r->depth++;
    r->host_freed = true;
    r->ended = true;
    timer_clear(r, &r->t_kick);
    if (r->disposing && r->proc && !r->exited) {
      /* A dispose already under way gets the shorter withdraw graces. */
      if (r->t_grace) {
        timer_clear(r, &r->t_grace);
        if (c->api->timer_start(c->m, ACP_WITHDRAW_EOF_GRACE_MS, 0, on_grace, r, &r->t_grace) != 0) {
          r->t_grace = NULL;
          r->killing = true;
          c->api->process_kill(r->proc, ACP_WITHDRAW_KILL_GRACE_MS);
        }
      } else if (r->killing) {
        c->api->process_kill(r->proc, ACP_WITHDRAW_KILL_GRACE_MS);
      }
    }
    run_dispose(r);
    if (r->t_errdrain) {
      timer_clear(r, &r->t_errdrain);
      if (c->api->timer_start(c->m, ACP_WITHDRAW_STDERR_DRAIN_MS, 0, on_errdrain, r, &r->t_errdrain) != 0) {
        r->t_errdrain = NULL;
        err_close(r);
      }
    }
    r->depth--;
  }
  /* Free what is already over; the last free reports done (acp_child_finish), later callbacks do the rest. */
  for (;;) {
    acp_run *first = NULL;
    for (acp_link *l = c->runs.next; l != &c->runs; l = l->next) {
      acp_run *r = (acp_run *)l;
      if (!(r->depth > 0 || r->proc || r->peer || r->err_open || r->perm)) {
        first = r;
        break;
      }
    }
    if (!first)
      return;
    bool last = c->runs.next == &first->link && first->link.next == &c->runs;
    run_free(first);
    if (last)
      return; /* done is on its way */
  }
}
