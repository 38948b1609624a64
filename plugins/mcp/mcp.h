/* agenthost mcp plugin — an MCP client: the tools of MCP servers, as a tool source (ABI 1.6) with the prefix
 * "mcp__". Shared types of its files:
 *
 *   mcp.c      the plugin: configuration, the tool source (list, call), naming, attached servers
 *   server.c   one server: start (initialize, initialized, tools/list with pagination), its calls, list
 *              changes, progress, cancellation, failure, restart with backoff, stop
 *   stdio.c    the stdio transport: a child through the host's process service and the host's JSON-RPC peer
 *   http.c     the Streamable HTTP transport on the host's HTTP client (ABI 1.4)
 *
 * Servers are host-wide (`[mcp.NAME]`, started lazily at first use and shared by every session) or attached
 * to one session by a client (`mcp.attach`, e.g. the acp plugin for an editor's mcpServers), stopped when
 * the session closes or is detached. */
#ifndef AGENTHOST_MCP_H
#define AGENTHOST_MCP_H

#include <agenthost/plugin.h>

#include <stdbool.h>
#include <stdint.h>

#define MCP_PREFIX "mcp__"
#define MCP_NAME_MAX 64                    /* a tool's full name */
#define MCP_MAX_MESSAGE ((size_t)16 << 20) /* one message from a server */
#define MCP_DEFAULT_STARTUP_MS 10000u
#define MCP_DEFAULT_TOOL_MS 60000u
#define MCP_BACKOFF_FIRST_MS 1000u
#define MCP_BACKOFF_MAX_MS 30000u
#define MCP_EOF_GRACE_MS 1000u  /* stdin closed → SIGTERM */
#define MCP_KILL_GRACE_MS 2000u /* SIGTERM → SIGKILL */
#define MCP_MAX_PAGES 100       /* tools/list pages */
#define MCP_MAX_TOOLS 1000      /* tools of one server */
#define MCP_PROTOCOL_LATEST "2025-11-25"

typedef struct mcp_plugin mcp_plugin;
typedef struct mcp_server mcp_server;

/* The answer to a request: status 0 with `result`, AH_EPROTO with the server's `error` object, or another
 * AH_E* with a message (the transport failed, the server went away, a timeout). All borrowed. */
typedef void (*mcp_reply_fn)(mcp_server *s, int status, const json_t *result, const json_t *error,
                             const char *message, void *arg);

/* A transport: how messages reach one server. */
typedef struct mcp_transport {
  /* Connect / spawn; messages may be sent right after. 0 or an AH_E* with *why (malloc'ed). */
  int (*open)(mcp_server *s, char **why);
  /* A request with an id of the transport's choice (*id gets it, for notifications/cancelled). `params`
   * stolen. The reply comes exactly once when 0 is returned, never inside this call. */
  int (*request)(mcp_server *s, const char *method, json_t *params, mcp_reply_fn cb, void *arg, int64_t *id);
  /* Stop waiting for request `id`: its callback never runs. */
  void (*forget)(mcp_server *s, int64_t id);
  int (*notify)(mcp_server *s, const char *method, json_t *params);
  /* Answer a request the server sent (`id` borrowed). */
  void (*respond)(mcp_server *s, void *inbound, json_t *result, int code, const char *message);
  /* Close an opened transport: the server goes away (stdio: stdin EOF → SIGTERM → SIGKILL);
   * mcp_server_closed() once nothing of it is left. */
  void (*close)(mcp_server *s);
} mcp_transport;

extern const mcp_transport mcp_stdio_transport;
extern const mcp_transport mcp_http_transport;

typedef enum mcp_state {
  MCP_IDLE = 0, /* not started (or stopped after a failure: started again at the next use) */
  MCP_STARTING,
  MCP_READY,
  MCP_CLOSING, /* the transport is closing; then IDLE again, or freed when `removed` */
} mcp_state;

/* A waiter for a server to be ready (or to have failed). */
typedef void (*mcp_ready_fn)(mcp_server *s, int status, const char *message, void *arg);

struct mcp_server {
  mcp_plugin *pl;
  mcp_server *next;
  char *name;       /* as configured ([mcp.NAME] or the attached server's name) */
  char *session_id; /* NULL: host-wide */
  json_t *conf;     /* normalised: {command, args, env, cwd} or {url, headers, bearer_token_env} */
  const mcp_transport *tr;
  json_t *enabled_tools;  /* NULL = all */
  json_t *disabled_tools; /* NULL = none */
  uint32_t startup_ms;
  uint32_t tool_ms;
  mcp_state state;
  bool removed;      /* stop, then free */
  bool restart;      /* stopped by a failure: starts again at the next use */
  char *error;       /* the last failure, for messages */
  uint64_t retry_at; /* loop ms before which a start is refused (backoff) */
  uint32_t backoff_ms;
  ah_timer *startup_timer;
  char protocol[24];
  json_t *tools; /* [{name (full), tool (the server's), description, schema}] once READY */
  bool relisting;
  bool relist_again;
  struct mcp_wait *waiters;
  struct mcp_run *runs; /* tools/call in flight */
  uint64_t progress_seq;
  void *t; /* the transport's state */
};

struct mcp_plugin {
  const ah_host_api *api;
  ah_mount *m;
  mcp_server *servers;
  ah_sub *closed_sub;
  bool withdrawing;
  ah_withdraw_done_fn done;
  bool has_http;
};

/* server.c */
mcp_server *mcp_server_new(mcp_plugin *pl, const char *name, const char *session_id, const json_t *conf,
                           char **why);
/* Ready (0) or failed (an AH_E* with a message): `cb` runs once, on a later loop turn or at once when the
 * server is ready or refused to start. */
void mcp_server_ensure(mcp_server *s, mcp_ready_fn cb, void *arg);
/* Forget a waiter's callback (a cancelled list). */
void mcp_server_unwait(mcp_server *s, mcp_ready_fn cb, void *arg);
/* Run tool `tool` (the server's own name) for `call` (a tool source call): answered through the API. */
void mcp_server_call(mcp_server *s, ah_call *call, const char *tool, const json_t *arguments);
/* Stop and free (removed) it; running calls fail with `why`. */
void mcp_server_remove(mcp_server *s, const char *why);
/* From the transport. */
void mcp_server_message(mcp_server *s, const char *method, const json_t *params, void *inbound);
void mcp_server_lost(mcp_server *s, const char *why); /* the connection or the child is gone */
void mcp_server_closed(mcp_server *s);                /* nothing of the transport is left */
void mcp_log(mcp_plugin *pl, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
char *mcp_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* map.c */

/* map.c: the pure mappings. */
/* mcp__SERVER__TOOL, each part sanitised to [A-Za-z0-9_-], at most MCP_NAME_MAX bytes (a longer one cut
 * and ended with a hash of the whole). */
void mcp_full_name(const char *server, const char *tool, char out[MCP_NAME_MAX + 1]);
/* The normalised configuration of one server, from [mcp.NAME] (strings) or an attached server (ACP's
 * shape). NULL with *why (malloc'ed); *skip when it is disabled. */
json_t *mcp_normalize(const json_t *raw, bool *skip, char **why);
/* A tools/call result as the model reads it: {content: text, structuredContent?}; *is_error from isError;
 * *text_out the text (malloc'ed). NULL when out of memory. */
json_t *mcp_map_result(const json_t *result, bool *is_error, char **text_out);

/* mcp.c */
void mcp_plugin_server_gone(mcp_plugin *pl); /* a removed server was freed */
void mcp_plugin_tools_changed(mcp_plugin *pl, mcp_server *s);

#endif
