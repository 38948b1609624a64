/* agenthost — the plugin ABI.
 *
 * A plugin is a shared module that exports exactly one symbol, ah_plugin_entry_v1(). The host calls it
 * with its ABI version and gets back a constant descriptor; it calls the descriptor's mount() on its loop
 * thread with a mount handle, the host API table and the plugin's config, and later withdraw().
 *
 * Everything the plugin does with the host goes through `const ah_host_api *api`: a plugin has no
 * link-time dependency on the host (build it with -Wl,-z,defs and -fvisibility=hidden).
 *
 * Rules (docs/plugin-guide.md has the whole contract):
 * - registrations are made only inside mount(); outside it they fail with AH_ESTATE;
 * - a failed registration fails the mount even if the plugin ignores the return code;
 * - all state lives behind the state pointer set by mount(): no statics, atexit handlers, TLS destructors,
 *   signal handlers or allocator hooks, so a remount of the same mapping starts fresh;
 * - timers, posted tasks, pool work, child processes and JSON-RPC peers come from the host, which counts
 *   them and cancels what is left at withdraw;
 * - every function of the API is called on the loop thread unless its comment says otherwise;
 * - strings passed to the host are copied by it: the host never points into the plugin after withdraw.
 *
 * The growth rule (within a major; docs/plugin-guide.md "ABI versions and struct sizes"):
 * 1. Every addition bumps AH_ABI_MINOR and is marked "ABI 1.N" where it is declared. A plugin's descriptor
 *    states the minor it was built for (`abi`); the host refuses a newer minor than its own, naming both.
 * 2. ABI structs start with `uint32_t struct_size` (sizeof of the writer's build) and grow only at the
 *    tail. A `reserved` slot is never given a meaning: additions go after the reserved slots. (Until ABI
 *    1.1, additions to ah_host_api filled its reserved slots: its size did not change, so for the entries
 *    marked 1.1 only a NULL check tells a host that has them from an earlier 1.1 host.)
 * 3. Readers check before they use a later field: AH_HAS(ptr, type, field) for a function or pointer that
 *    must be set (the struct is long enough and the field is not NULL), AH_HAS_FIELD() for a plain value.
 *    The host zero-fills what it does not provide, so an entry a host lacks always reads as absent.
 * 4. An array of ABI structs carries its element size beside it (ah_remote_def.param_size), so that the
 *    element type can grow too.
 */
#ifndef AGENTHOST_PLUGIN_H
#define AGENTHOST_PLUGIN_H

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#include "agenthost/errors.h"
#include "agenthost/jsonrpc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: major in the high 16 bits, minor in the low 16. The host accepts a plugin built for the
 * same major and a minor ≤ its own. */
#define AH_ABI_MAJOR 1
#define AH_ABI_MINOR 9
#define AH_ABI_MAKE(major, minor) ((uint32_t)(((uint32_t)(major) << 16) | ((uint32_t)(minor)&0xffffu)))
#define AH_ABI_VERSION AH_ABI_MAKE(AH_ABI_MAJOR, AH_ABI_MINOR)
#define AH_ABI_MAJOR_OF(v) ((uint32_t)(v) >> 16)
#define AH_ABI_MINOR_OF(v) ((uint32_t)(v)&0xffffu)

/* True when the size-prefixed struct at `ptr` is large enough to contain `field`. */
#define AH_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))
/* True when `field` is there and set (a function or pointer not NULL, a number not 0): check every entry
 * added after the minor you require before using it, e.g.
 *   if (AH_HAS(api, ah_host_api, stdio_rpc)) rc = api->stdio_rpc(m, config, &opts, &peer); */
#define AH_HAS(ptr, type, field) (AH_HAS_FIELD(ptr, type, field) && (ptr)->field != 0)

#define AH_EXPORT __attribute__((visibility("default")))

typedef struct ah_mount ah_mount;   /* one loaded plugin instance (host-owned) */
typedef struct ah_call ah_call;     /* one in-flight call into a method or remote descriptor */
typedef struct ah_cancel ah_cancel; /* a cancellation token (host-owned) */
typedef struct ah_cancel_watch ah_cancel_watch;
typedef struct ah_sub ah_sub;         /* an event subscription */
typedef struct ah_timer ah_timer;     /* a host timer */
typedef struct ah_process ah_process; /* a child process */
typedef struct ah_record ah_record;   /* a connection's recording (ABI 1.9) */
typedef struct ah_host_api ah_host_api;
typedef struct ah_provider ah_provider; /* agenthost/provider.h */
typedef struct ah_session ah_session;   /* a session looked up for a remote descriptor */
typedef struct ah_http ah_http;         /* an HTTP transfer (ABI 1.4) */

/* ---------------------------------------------------------------------------------------------------- */
/* The descriptor                                                                                        */

/* Called when the plugin's work is finished after withdraw(): every handle closed, every thread joined.
 * Call it exactly once, from the loop thread, possibly before withdraw() returns. */
typedef void (*ah_withdraw_done_fn)(ah_mount *m);

typedef struct ah_plugin_desc {
  uint32_t struct_size; /* sizeof(ah_plugin_desc) of the plugin's build */
  uint32_t abi;         /* AH_ABI_VERSION of the plugin's build */
  const char *name;     /* [a-z][a-z0-9-]{0,31}; unique among mounted plugins; its [plugin.NAME] */
  const char *version;  /* free text, e.g. "1.2.0" */
  const char *description;
  /* Required. Register methods, events and descriptors; start work. `config` is the plugin's config
   * object (borrowed for the call: copy what you keep; never NULL). Set *state (may stay NULL). Return 0
   * or a negative AH_E* code. When mount() returns an error, withdraw() is not called: free what you
   * allocated before returning; the host undoes every registration, stops what the plugin started through
   * it and unloads the module. When mount() returns 0 but a registration failed, the mount fails all the
   * same and the host calls withdraw() before unloading, so that the state is released. */
  int (*mount)(ah_mount *m, const ah_host_api *api, const json_t *config, void **state);
  /* Optional. Stop: close every handle, join every thread, free state, then call done(m). Calls of the
   * mount have been answered `cancelled` and drained before it runs. NULL = nothing to stop. */
  void (*withdraw)(ah_mount *m, void *state, ah_withdraw_done_fn done);
  /* Optional. Asked before anything is withdrawn; returning non-zero (AH_EBUSY) vetoes the unload,
   * which then fails with that code and changes nothing. NULL = always allowed. */
  int (*may_withdraw)(void *state);
  void *reserved[8];
  /* ABI 1.3. Optional: commands of the command line, NULL-terminated (see ah_command_def below). */
  const struct ah_command_def *const *commands;
} ah_plugin_desc;

/* A command a plugin adds to the command line (ABI 1.3): `agenthost NAME ARGS…` for a NAME the host
 * does not know runs the `run` of the enabled plugin that offers it, in the command's own process. The
 * module is loaded but never mounted: `run` gets no host API and no loop, only this environment; it may
 * ask a running daemon through `call` (the admin socket). The browser's `agenthost url` and
 * `agenthost token rotate` are such commands. */
typedef struct ah_command_env {
  uint32_t struct_size;
  const char *name;        /* the plugin's name */
  const json_t *config;    /* its [plugin.NAME] section, as mount() would get it (never NULL) */
  const char *state_dir;   /* the host's directories (absolute) */
  const char *runtime_dir; /* (the admin socket and the daemon's lock live here) */
  FILE *out;               /* the command's stdout and stderr */
  FILE *err;
  /* Call a method of the running daemon over its admin socket (privileged). 0 with *result (new
   * reference) or a negative AH_E* with *error ({code, message, data}, new reference, may be NULL): the
   * answer's own code (its data.name), AH_ECLOSED with *error NULL when no daemon answers, AH_ETIMEDOUT.
   * `params` is borrowed (NULL = {}). */
  int (*call)(const struct ah_command_env *env, const char *method, const json_t *params, uint32_t timeout_ms,
              json_t **result, json_t **error);
  void *reserved[4];
} ah_command_env;

typedef struct ah_command_def {
  uint32_t struct_size; /* sizeof(ah_command_def) of the plugin's build */
  const char *name;     /* the word after `agenthost`, [a-z][a-z0-9-]{0,31}; a host command wins */
  const char *usage;    /* one line for messages, e.g. "token rotate" */
  /* argv[0] is the command's name; the return value is the process's exit status (0, 1 a failure, 2
   * a usage error). */
  int (*run)(const ah_command_env *env, int argc, char **argv);
  void *reserved[4];
} ah_command_def;

/* The one exported symbol. Return NULL to refuse the host's ABI. */
typedef const ah_plugin_desc *(*ah_plugin_entry_fn)(uint32_t host_abi);
#define AH_PLUGIN_ENTRY_SYMBOL "ah_plugin_entry_v1"

/* ---------------------------------------------------------------------------------------------------- */
/* Callers and calls                                                                                     */

typedef enum ah_authority {
  AH_AUTH_INVALID = 0,
  AH_AUTH_LAN,         /* a network peer that is not loopback: never privileged */
  AH_AUTH_LOOPBACK,    /* a loopback peer with a valid token: privileged */
  AH_AUTH_STDIO_OWNER, /* the process that spawned us on stdio (sdk, acp): privileged */
  AH_AUTH_ADMIN,       /* the admin socket (0600 in a 0700 directory) and the host itself: privileged */
} ah_authority;

typedef struct ah_caller {
  uint32_t struct_size;
  ah_authority authority;
  const char *surface;    /* "browser", "sdk", "acp", "admin", "core", … (copied by the host) */
  uint64_t connection_id; /* surface-defined; 0 when none */
  void *reserved[4];
} ah_caller;

/* The outcome of a call as seen by its caller. status == 0: `result` is the value (borrowed for the
 * callback, never NULL). status < 0: an AH_E* code with `message` (never NULL) and `data` (may be NULL). */
typedef struct ah_outcome {
  int status;
  const json_t *result;
  const char *message;
  const json_t *data;
} ah_outcome;

typedef void (*ah_reply_fn)(const ah_outcome *outcome, void *arg);

/* Every ah_call begins with this head (ABI 1.1), so that a remote descriptor's function, which gets only
 * the call, reaches the host API and its descriptor's `data`; a method handler finds its definition's
 * `data` there too. Read it with the macros; never write it. */
typedef struct ah_call_head {
  const struct ah_host_api *api;
  void *data;
} ah_call_head;
#define AH_CALL_API(call) (((const ah_call_head *)(const void *)(call))->api)
#define AH_CALL_DATA(call) (((const ah_call_head *)(const void *)(call))->data)

/* Method flags: exactly one of PUBLIC / PRIVILEGED is required (deny by default). */
enum {
  AH_METHOD_PUBLIC = 1u << 0,
  AH_METHOD_PRIVILEGED = 1u << 1,  /* refused by the core to callers without privileged authority */
  AH_METHOD_CANCELLABLE = 1u << 2, /* the handler gets a cancellation token (ah_host_api.call_cancel_token) */
};

/* A method handler. `params` is borrowed until the call is answered (never NULL: {} when absent).
 * Answer exactly once with call_reply() or call_error(), now or later, also after cancellation. */
typedef void (*ah_method_fn)(ah_call *call, const json_t *params, void *data);

typedef struct ah_method_def {
  uint32_t struct_size;
  const char *name; /* "namespace.name": lower-case segments [a-z][a-z0-9_-]*, dot-separated, ≤ 128 bytes */
  ah_method_fn handler;
  uint32_t flags;
  void *data; /* passed to the handler */
  void *reserved[4];
} ah_method_def;

/* Event flags. */
enum {
  AH_EVENT_ALLOWLISTED = 1u << 0, /* may be forwarded to clients (remote event allowlist) */
};

/* ---------------------------------------------------------------------------------------------------- */
/* Remote descriptors (DECISIONS.md "Remote functions in C")                                             */

typedef enum ah_type {
  AH_TYPE_INVALID = 0,
  AH_TYPE_VOID,    /* results only */
  AH_TYPE_BOOL,    /* bool */
  AH_TYPE_INT64,   /* int64_t */
  AH_TYPE_DOUBLE,  /* double */
  AH_TYPE_STRING,  /* const char * (param, borrowed) / char * (result, malloc'ed, owned by the host) */
  AH_TYPE_JSON,    /* json_t * (param borrowed / result stolen) */
  AH_TYPE_SESSION, /* a looked-up session (first parameter only) */
  AH_TYPE_AGENT,   /* a looked-up agent (first parameter only) */
} ah_type;

typedef enum ah_lookup {
  AH_LOOKUP_INVALID = 0,
  AH_LOOKUP_NONE,
  AH_LOOKUP_SESSION, /* params[0] is AH_TYPE_SESSION */
  AH_LOOKUP_AGENT,   /* params[0] is AH_TYPE_AGENT */
} ah_lookup;

/* An element of ah_remote_def.params. It may grow at the tail: the host steps through the array by
 * ah_remote_def.param_size (ABI 1.2). */
typedef struct ah_remote_param {
  const char *name; /* [a-z][A-Za-z0-9_]* */
  ah_type type;
  bool optional; /* passed as a pointer, NULL when absent (const int64_t *, const bool *, const double *) */
} ah_remote_param;

enum {
  AH_REMOTE_CANCELLABLE = 1u << 0, /* ah_call_cancel_token() returns a token; else NULL */
  AH_REMOTE_LONG = 1u << 1,        /* run on the thread pool instead of the loop thread */
  AH_REMOTE_PRIVILEGED = 1u << 2,  /* only for callers with privileged authority */
};

/* The C function: int fn(ah_call *call, A1 a1, …, An an, R *out) returning 0 or a negative AH_E*.
 * For AH_TYPE_VOID results there is no `out` parameter. Store it with AH_REMOTE_FN(fn): the host calls
 * it through libffi with the real signature built from the descriptor. */
typedef void (*ah_remote_fn)(void);
#define AH_REMOTE_FN(fn) ((ah_remote_fn)(void (*)(void))(fn))

typedef struct ah_remote_def {
  uint32_t struct_size;
  const char *ns;     /* namespace: [a-z][a-z0-9_-]* */
  const char *method; /* [a-z][A-Za-z0-9_]* */
  const ah_remote_param *params;
  size_t nparams; /* ≤ 16 */
  ah_type result;
  bool result_optional; /* result may be null (pointer results only: string, json) */
  uint32_t flags;
  ah_lookup lookup;
  ah_remote_fn fn;
  void *reserved[4];
  void *data; /* ABI 1.1: AH_CALL_DATA(call) in the function */
  /* ABI 1.2: sizeof(ah_remote_param) of the plugin's build (the stride of `params`); 0, or a module built
   * before 1.2, means the layout of ABI 1.0. */
  size_t param_size;
} ah_remote_def;

/* ---------------------------------------------------------------------------------------------------- */
/* Host services                                                                                        */

typedef void (*ah_cancel_fn)(ah_cancel *token, void *arg);
typedef void (*ah_event_fn)(const char *name, const json_t *data, void *arg);
typedef void (*ah_timer_fn)(ah_timer *timer, void *arg);
typedef void (*ah_task_fn)(void *arg);
/* Pool work: `work` runs on a pool thread; `after` runs on the loop thread with 0, or AH_ECANCELED when
 * the work was cancelled before it started (withdraw) — then `work` never ran. */
typedef void (*ah_work_fn)(void *arg);
typedef void (*ah_after_fn)(void *arg, int status);
/* A child's exit: `exit_status` as from exit(), `term_signal` the signal that ended it (0 if none). */
typedef void (*ah_exit_fn)(ah_process *proc, int64_t exit_status, int term_signal, void *arg);

typedef struct ah_process_opts {
  uint32_t struct_size;
  const char *file;        /* program; looked up in PATH when it has no slash */
  const char *const *args; /* NULL-terminated, args[0] is the program name */
  const char *const *env;  /* NULL-terminated "NAME=value" added after the allowlist; may be NULL */
  const char *cwd;         /* absolute; NULL = the host's cwd */
  bool pipe_stdin;         /* else /dev/null */
  bool pipe_stdout;        /* else /dev/null */
  bool pipe_stderr;        /* else inherited (the host's stderr) */
  ah_exit_fn on_exit;      /* required */
  void *arg;
  void *reserved[4];
  /* ABI 1.6: the host reads the child's stderr itself and logs each line on the host's log, escaped and
   * tagged with the plugin's name, `log_tag` (copied; NULL = the program's name) and the pid — at most
   * 64 KiB per child, lines cut at 512 bytes. pipe_stderr is then ignored (process_stderr() is NULL). */
  bool stderr_to_log;
  const char *log_tag;
} ah_process_opts;

typedef enum ah_log_level_pub {
  AH_PLOG_ERROR = 1,
  AH_PLOG_WARN = 2,
  AH_PLOG_INFO = 3,
  AH_PLOG_DEBUG = 4,
} ah_log_level_pub;

/* ---------------------------------------------------------------------------------------------------- */
/* HTTP client (ABI 1.4)                                                                                  */

/* One HTTP(S) request through the host's client (libcurl on the host loop: TLS verified against the
 * system CA store, HTTP/2, compression, asynchronous DNS, and HTTPS_PROXY / NO_PROXY from the
 * environment). Everything is copied by http_start(); the callbacks run on the loop thread, never inside
 * http_start(). The host counts a plugin's transfers: one still running when withdraw completes is
 * aborted (without callbacks) and logged. */
typedef struct ah_http_request {
  uint32_t struct_size;
  const char *method;          /* "GET", "POST", … ; NULL = POST with a body, else GET */
  const char *url;             /* http:// or https:// (no other scheme; redirects are not followed) */
  const json_t *headers;       /* {"Name": "value"} sent as given; NULL = none */
  const char *body;            /* NULL = none */
  size_t body_len;             /* at most 64 MiB */
  const char *ca_file;         /* PEM file of the CAs to trust instead of the system store; NULL = system */
  size_t max_response;         /* body bytes before the transfer fails with AH_E2BIG; 0 = 64 MiB */
  uint32_t connect_timeout_ms; /* TCP + TLS; 0 = 30 s */
  uint32_t first_byte_timeout_ms; /* from the start to the response's head; 0 = no limit of its own */
  uint32_t idle_timeout_ms;       /* no byte received for this long; 0 = 300 s */
  uint32_t total_timeout_ms;      /* the whole transfer; 0 = none */
  ah_cancel *cancel; /* tripped: the transfer is aborted and done gets AH_ECANCELED; may be NULL */
  /* The response's status and headers ({"lower-case-name": "value"}, repeats joined with ", "), once,
   * before any body. Non-zero aborts the transfer (done gets AH_ECANCELED). NULL = not wanted. */
  int (*on_head)(ah_http *h, int status, const json_t *headers, void *arg);
  /* A piece of the body as it arrives (borrowed for the call). Non-zero aborts (AH_ECANCELED). */
  int (*on_body)(ah_http *h, const char *data, size_t len, void *arg);
  /* Required. Once, last: 0 when the whole response arrived (whatever its status), else a negative
   * AH_E* with a message (never NULL) that names the URL's host and what failed:
   *   AH_EUNAVAILABLE  no connection (refused, unreachable, name not resolved)
   *   AH_ETIMEDOUT     a timeout above
   *   AH_EIO           the connection broke during the response; a TLS failure (certificate refused)
   *   AH_E2BIG         the body passed max_response
   *   AH_ECANCELED     http_abort(), the token, or a callback's non-zero
   * The handle is gone when it returns. */
  void (*on_done)(ah_http *h, int status, const char *message, void *arg);
  void *arg;
  void *reserved[4];
} ah_http_request;

/* ---------------------------------------------------------------------------------------------------- */
/* Tools (ABI 1.5)                                                                                        */

/* A tool the agent may call, from a plugin: registered inside mount() like a method, in a namespace of its
 * own (a tool and a method may share a name). The handler is an ah_method_fn: it gets the call and
 * params {arguments, cwd, sessionId} — `arguments` what the model passed (a JSON object; validate it),
 * `cwd` the session's working directory — and answers with api->call_reply(call, result) (a JSON value
 * the model reads) or api->call_error(call, code, message, data) (the model reads the message as the
 * tool's error). Cancellation (the turn was cancelled, the plugin is withdrawn): the call's token,
 * api->call_cancel_token(call), trips; the call is then answered `cancelled` by the host. A tool runs
 * only when the session's policy allows it: the default for a plugin's tool is `ask`. */
typedef struct ah_tool_def {
  uint32_t struct_size;
  const char *name;        /* [A-Za-z0-9_-]{1,64}, not the name of a built-in tool; copied */
  const char *description; /* what the model reads to choose it (required; copied) */
  const json_t *schema;    /* JSON Schema of `arguments` (an object schema; copied); NULL = any object */
  ah_method_fn handler;    /* required */
  void *data;              /* AH_CALL_DATA(call) */
  void *reserved[4];
} ah_tool_def;

/* A source of tools that come and go while the plugin runs (ABI 1.6): the MCP client's servers, which start
 * lazily, change their lists and differ per session. Registered inside mount() like a method; the host asks
 * it at the start of every turn.
 *
 * Every tool name of the source begins with its `prefix` ([a-z][a-z0-9]*__, ≤ 16 bytes, e.g. "mcp__"): a
 * session's policy may name such a tool before the source has listed it, and a plugin's tool may not take a
 * name under it. Both handlers have a method handler's signature and run as calls (counted on the mount,
 * answered `cancelled` for you at withdraw; their token trips when the turn is cancelled):
 *   list  params {sessionId, cwd}: answer with [{name, description, schema, group?, kind?}] — the tools
 *         that session sees now (`kind`, what the tool does: read | edit | delete | move | search |
 *         execute | think | fetch | other, shown by clients and read by the session's mode — absent or
 *         unknown is other; `group`, e.g. the server's name, is how a UI shows them together; entries with a
 *         name outside the prefix or an invalid one are dropped and logged) — or with {tools: that array,
 *         notices: [string]}, notices being what the user should learn (a server that did not start). The
 *         turn waits for the answer: answer within your own start-up limit with what you have (an error
 *         leaves the source out of the turn, with a notice the user sees: the message).
 *   call  params {tool, arguments, cwd, sessionId}: run one; as an ah_tool_def handler. Progress goes with
 *         api->call_progress(call, …). */
typedef struct ah_tool_source_def {
  uint32_t struct_size;
  const char *prefix;
  ah_method_fn list; /* required */
  ah_method_fn call; /* required */
  void *data;        /* AH_CALL_DATA(call) of both */
  void *reserved[4];
} ah_tool_source_def;

/* ---------------------------------------------------------------------------------------------------- */
/* Hooks (ABI 1.7)                                                                                        */

/* A hook: a handler the host calls at one point of what an agent does, to observe, veto or amend it
 * (docs/hooks.md). Registered inside mount() like a method; its name ([a-z][a-z0-9-]*, ≤ 40 bytes) is
 * unique among the plugins' hooks and is how the session's log and `agenthost hooks list` name it.
 * Points (`event`): before_tool, after_tool, prompt_submit, turn_end, session_start, session_close.
 * The handler runs as a call (counted on the mount; its token trips when the turn is cancelled or the
 * timeout passes) with params = the hook's document {event, hook, sessionId, turnId?, cwd, provider,
 * model?, tool?, prompt?, turn?, session?} and answers with api->call_reply(call, answer):
 * null or {} = allow; {decision: "deny", reason} = deny; {arguments: {...}} (before_tool) replaces the
 * arguments the tool runs with; {context: "text"} (prompt_submit, after_tool) adds text for the model.
 * A call error, a timeout, or the plugin's withdraw during the call is an error that `on_error` turns into
 * a denial or an allow. Hooks of the configuration run first, then the plugins' in mount order. */
typedef struct ah_hook_def {
  uint32_t struct_size;
  const char *name;         /* copied */
  const char *event;        /* one of the points above */
  const char *const *match; /* NULL-terminated shell patterns of tool names (tool points); NULL = all */
  uint32_t timeout_ms;      /* 0 = 30 000; at most 600 000 */
  const char *on_error;     /* "deny" | "allow"; NULL = deny for before_tool and prompt_submit, else allow */
  ah_method_fn handler;     /* required */
  void *data;               /* AH_CALL_DATA(call) */
  void *reserved[4];
} ah_hook_def;

struct ah_host_api {
  uint32_t struct_size;
  uint32_t abi; /* AH_ABI_VERSION of the host */

  /* Logging: one escaped line on the host's log, tagged with the plugin's name. Any thread. */
  void (*log)(ah_mount *m, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

  /* Registration — only inside mount(): else AH_ESTATE. Names and definitions are copied.
   * Returns 0, AH_EINVAL (bad name, flags or types; logged with the field), AH_EEXIST (duplicate against
   * live and staged entries), AH_ESTATE, AH_ENOMEM. */
  int (*register_method)(ah_mount *m, const ah_method_def *def);
  int (*register_event)(ah_mount *m, const char *name, uint32_t flags);
  int (*register_remote)(ah_mount *m, const ah_remote_def *def);

  /* Calls. call_reply steals `result` (NULL = null); call_error steals `data`. Each returns 0, or
   * AH_ECANCELED when the caller was already answered `cancelled` (the value is dropped), or AH_ESTATE
   * on a second answer. The call stays valid until the plugin's own first answer (also after the host
   * answered the caller `cancelled`); after it, `call` may be freed: do not use it again. */
  int (*call_reply)(ah_call *call, json_t *result);
  int (*call_error)(ah_call *call, int status, const char *message, json_t *data);
  /* The call's token: NULL unless the method or descriptor is cancellable. */
  ah_cancel *(*call_cancel_token)(ah_call *call);
  const ah_caller *(*call_caller)(ah_call *call);

  /* Dispatch a method by name for a caller (surfaces use this to reach the core and other plugins).
   * `params` is stolen (NULL = {}). `parent` (may be NULL) links the call's token under another token
   * (e.g. a connection's). Returns an error without calling `cb` (AH_ENOMETHOD, AH_EUNAVAILABLE,
   * AH_EPERM, AH_EINVAL, AH_ESTATE when the host is stopping), else 0 and `cb` runs exactly once. */
  int (*dispatch)(ah_mount *m, const ah_caller *caller, const char *method, json_t *params, ah_cancel *parent,
                  ah_reply_fn cb, void *arg);

  /* Cancellation. A token created by token_new is a child of the mount's token (or of `parent`) and is
   * tripped with it; the plugin frees it with token_free (the host frees those left at withdraw).
   * watch: `fn` runs once on the loop thread when the token trips; returns AH_ECANCELED (and never calls
   * fn) when it is already tripped. A watch ends when it fired (do not unwatch it after `fn` ran), with its
   * token, or with unwatch. token_tripped may be called from any thread. */
  int (*token_new)(ah_mount *m, ah_cancel *parent, ah_cancel **out);
  void (*token_trip)(ah_cancel *token);
  void (*token_free)(ah_cancel *token);
  bool (*token_tripped)(const ah_cancel *token);
  int (*token_watch)(ah_cancel *token, ah_cancel_fn fn, void *arg, ah_cancel_watch **out);
  void (*token_unwatch)(ah_cancel_watch *watch);

  /* Event bus. emit: `name` must be registered by this mount (else AH_ENOENT); `data` stolen (NULL = {}).
   * subscribe: `pattern` is an exact name, "prefix.*" or "*"; delivery is ordered per subscriber, on later
   * loop turns; subscriptions end at withdraw. */
  int (*emit)(ah_mount *m, const char *name, json_t *data);
  int (*subscribe)(ah_mount *m, const char *pattern, ah_event_fn fn, void *arg, ah_sub **out);
  void (*unsubscribe)(ah_sub *sub);

  /* Work the host tracks. A timer fires after timeout_ms and then every repeat_ms (0 = once; a one-shot
   * timer is freed by the host after its callback); timer_stop frees it (also from its callback).
   * post: `fn` runs on a later loop turn. queue_work: see ah_work_fn. At withdraw the host stops what is
   * left, cancels pool work that has not started, and waits for what runs. */
  int (*timer_start)(ah_mount *m, uint64_t timeout_ms, uint64_t repeat_ms, ah_timer_fn fn, void *arg,
                     ah_timer **out);
  void (*timer_stop)(ah_timer *timer);
  int (*post)(ah_mount *m, ah_task_fn fn, void *arg);
  int (*queue_work)(ah_mount *m, ah_work_fn work, ah_after_fn after, void *arg);

  /* Child processes: environment = allowlist (HOME LOGNAME PATH SHELL TERM USER LANG LC_* TZ TMPDIR,
   * values starting with "()" dropped) + opts->env; own process group. The pipes are host-owned
   * streams, valid until on_exit returned (read them with the JSON-RPC peer or uv_read_start).
   * kill: SIGTERM to the group, SIGKILL after `grace_ms`; on_exit runs once the exit is observed and
   * the pipes are closed; the host frees the process after on_exit. At withdraw the host kills what is
   * left. */
  int (*spawn)(ah_mount *m, const ah_process_opts *opts, ah_process **out);
  int (*process_kill)(ah_process *proc, uint64_t grace_ms);
  int (*process_pid)(const ah_process *proc);
  uv_stream_t *(*process_stdin)(ah_process *proc);
  uv_stream_t *(*process_stdout)(ah_process *proc);
  uv_stream_t *(*process_stderr)(ah_process *proc);
  /* Close the child's stdin (EOF); safe to call more than once. */
  void (*process_close_stdin)(ah_process *proc);

  /* JSON-RPC peers (see agenthost/jsonrpc.h). A peer opened by a plugin must be closed by it before its
   * withdraw completes. */
  const ah_rpc_api *rpc;

  /* The loop itself, only for a plugin that must hand it to a library (libwebsockets). The plugin then
   * owns closing every handle that library made before calling done() in withdraw(); a handle left with a
   * callback in the plugin or its libraries keeps the module mapped (zombie). */
  uv_loop_t *(*loop)(ah_mount *m);

  /* Information. */
  const char *(*mount_name)(ah_mount *m);
  const char *(*host_version)(void);
  const char *(*state_dir)(ah_mount *m);
  const char *(*runtime_dir)(ah_mount *m);

  /* Appended after the first draft of ABI 1.0 (structs grow at the tail). */
  /* The `arg` of its ah_process_opts, and the process one of its pipe streams belongs to (only for streams
   * returned by process_stdin/stdout/stderr: a read callback finds its owner without a static). The pipes
   * stay open after the exit while they are being read, up to a second, so the tail of the output is not
   * lost; on_exit runs once they are closed. */
  void *(*process_arg)(ah_process *proc);
  ah_process *(*process_of_stream)(uv_stream_t *stream);

  /* The process's standard input and output for a stdio surface (the sdk and acp modes): host-owned
   * streams on fd 0 and 1, given to one mount at a time (AH_EBUSY for a second one; AH_ENOENT when the
   * host runs as a daemon, whose stdio is not a protocol channel, or when fd 0/1 are not pipes, sockets
   * or terminals). The host closes them when the mount is withdrawn; close your JSON-RPC peer first. */
  int (*stdio)(ah_mount *m, uv_stream_t **in, uv_stream_t **out);
  /* Ask the host to stop as on SIGTERM (every plugin withdrawn, the loop closed) and to exit with
   * `exit_code`: what a stdio surface does when its client closes stdin. Returns at once. */
  void (*host_stop)(ah_mount *m, int exit_code);

  /* ABI 1.1. */
  /* Register a provider type (agenthost/provider.h): a session whose provider is configured with
   * `[provider.NAME] type = <p->name>` runs its turns on `p`; each turn's input names the configured
   * provider and carries its [provider.NAME] keys. `p->name` is the type ([a-z][a-z0-9-]*, not "echo");
   * one mount per type. Only inside mount(). `p` stays the plugin's and must stay valid until withdraw()
   * was called: before it, the host ends every turn still running on `p` (turn_cancel, then turn_free,
   * the turn recorded as ended with an error) and starts no new one. */
  int (*register_provider)(ah_mount *m, ah_provider *p);
  /* The mode the host runs in: "serve", "sdk" or "acp" (a plugin that is also a stdio surface claims
   * stdio only in its own mode). */
  const char *(*host_mode)(ah_mount *m);

  /* The remote gateway (plugins/remote; docs/protocols/remote.md). remote_describe: every active
   * descriptor, [{namespace, method, params: [{name, type, optional}], result, resultOptional,
   * cancellable, lookup, privileged, plugin}] (a new array). remote_invoke: call descriptor `ns`.`method`
   * for `caller` with the named `args` (a JSON object, borrowed for the call): the descriptor is looked up
   * again, the field set checked exactly, a session/agent argument resolved, the C function called through
   * libffi (on the thread pool for AH_REMOTE_LONG), its result checked against the result type. `parent`
   * (may be NULL) cancels the invocation. Returns AH_EINVAL (a NULL argument) or AH_ESTATE (the host is
   * stopping) without calling `cb`; else 0, and `cb` runs exactly once on a later loop turn with the value
   * or an error: AH_EINVAL (bad-request; the message names the field), AH_ENOENT (not-found: no such
   * descriptor or session), AH_EUNAVAILABLE (withdrawn), AH_ECANCELED, AH_EAGENTBUSY, AH_EPERM
   * (forbidden), AH_EINTERNAL. */
  json_t *(*remote_describe)(ah_mount *m);
  int (*remote_invoke)(ah_mount *m, const ah_caller *caller, const char *ns, const char *method,
                       const json_t *args, ah_cancel *parent, ah_reply_fn cb, void *arg);
  /* A looked-up session passed to a descriptor's function, valid until the function returns (also on a
   * pool thread). session_id may be called from any thread; session_info and session_update only on the
   * loop thread. session_info: the row as session.get shows it plus `pending`, the server requests waiting
   * for an answer ([{id, kind, tool?}]), and `options`, the session's options (docs/sessions.md
   * "Options"); a new reference. session_update sets `title` (string, ≤ 200 bytes), `tags` (≤ 32
   * non-empty strings of ≤ 64 bytes) and/or merges `policy` ({TOOL: allow|ask|deny} for known tools) —
   * applied to the live session at once and written behind, in order with its events — or, alone,
   * `options` ({ID: value}: the model, mode or reasoning effort; every pair is checked before any is set;
   * a host older than this field answers AH_EINVAL); returns 0, AH_EINVAL (a field or value not
   * allowed), AH_ECLOSED or AH_ENOMEM. */
  const char *(*session_id)(const ah_session *s);
  json_t *(*session_info)(ah_session *s);
  int (*session_update)(ah_session *s, const json_t *fields);
  /* A remote function about to return an error may say why (copied; the last one wins): the caller gets
   * this message instead of the generic one, e.g. "args.title: at most 200 bytes". Any thread, while the
   * function runs. */
  void (*call_set_message)(ah_call *call, const char *message);
  /* A JSON-RPC peer on the process's stdio for a stdio surface: stdio() and rpc->open() in one, with the
   * line cap taken from the plugin's config key `max_line` (a positive number of bytes; absent = the peer's
   * default; opts->max_line is ignored). Failures are logged: AH_ECONFIG (a bad max_line), or the codes of
   * stdio() and rpc->open(). Close the peer before withdraw completes, as for any peer. */
  int (*stdio_rpc)(ah_mount *m, const json_t *config, const ah_rpc_opts *opts, ah_rpc_peer **out);

  void *reserved[5];

  /* HTTP client (ABI 1.4; see ah_http_request). NULL in a host built without it (the meson feature
   * `http`): a plugin that needs it refuses to mount, saying so. http_start: 0 with *out, or AH_EINVAL
   * (a bad URL, scheme, method or header; a body over 64 MiB), AH_ESTATE (outside mount/active),
   * AH_ENOMEM. http_abort: the transfer stops at once (the server sees the connection close); on_done
   * gets AH_ECANCELED on a later loop turn, or at once when called from this transfer's own callback
   * (then after that callback returns). The handle is gone once on_done returned: never use it after. */
  int (*http_start)(ah_mount *m, const ah_http_request *req, ah_http **out);
  void (*http_abort)(ah_http *h);

  /* Tools (ABI 1.5; see ah_tool_def). Inside mount() only; AH_EEXIST for a name another mount (or a
   * built-in) has, AH_EINVAL (logged with the field) for a bad definition. Withdraw cancels the calls in
   * flight and removes the tools: the names are free again. */
  int (*register_tool)(ah_mount *m, const ah_tool_def *def);

  /* Tool sources (ABI 1.6; see ah_tool_source_def). register_tool_source: inside mount() only; AH_EEXIST
   * when the prefix overlaps another source's or an active tool's name, AH_EINVAL (logged) for a bad
   * definition. tools_changed: the source's tools changed for `session_id` (NULL = every session): the
   * host emits `tools.changed` {sessionId?} so that clients showing the list ask again (the next turn asks
   * the source anyway); 0 or AH_ESTATE (the mount is not active). call_progress: a tool's call (of a
   * plugin's tool or a source's) reports progress {progress: number, total?: number, message?: string}
   * (borrowed), shown with the tool's call; 0, AH_EINVAL (not a tool's call, or a bad object), or
   * AH_ECANCELED (the call was already answered). */
  int (*register_tool_source)(ah_mount *m, const ah_tool_source_def *def);
  int (*tools_changed)(ah_mount *m, const char *session_id);
  int (*call_progress)(ah_call *call, const json_t *progress);

  /* Hooks (ABI 1.7; see ah_hook_def). Inside mount() only; AH_EEXIST for a name another plugin's hook
   * has, AH_EINVAL (logged with the field) for a bad definition. Withdraw removes the hooks; a call in
   * flight is answered `cancelled` and counts as the hook's error. */
  int (*register_hook)(ah_mount *m, const ah_hook_def *def);

  /* Recordings of a surface's connections (ABI 1.9; docs/usage.md "Recordings"), for surfaces that do
   * their own I/O (the host records the stdio surfaces itself). record_open: a handle for one connection
   * `conn` (a label unique within this host run, e.g. "ws-17"), or NULL when recording is off or does not
   * include this plugin ([host] record_dir, record_surfaces): check once per connection and do no work
   * otherwise. record: one message as sent to the client (sent = true) or received from it — its bytes, kept
   * parsed when they are JSON, credentials redacted by name; `corr` (may be NULL) pairs a request with its
   * answer where the protocol has no ids (HTTP). record_close: the connection ended (`lost`: without a
   * clean close); the handle is freed. Handles still open at withdraw are closed by the host. Loop thread. */
  ah_record *(*record_open)(ah_mount *m, const char *conn);
  void (*record)(ah_record *r, bool sent, const char *data, size_t len, const char *corr);
  void (*record_close)(ah_record *r, bool lost);
};

/* The one exported entry of a plugin. */
AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi);

#ifdef __cplusplus
}
#endif

#endif
