/* agenthost — the `acp` provider: runs an external ACP agent as a child process for each turn
 * (PROTOCOLS.md ACP-CHILD-*). Part of the acp plugin: acp.c calls these from its mount() and withdraw(),
 * in every mode (the provider is available to sessions of every surface). */
#ifndef AGENTHOST_ACP_CHILD_H
#define AGENTHOST_ACP_CHILD_H

#include <agenthost/plugin.h>
#include <agenthost/provider.h>

typedef struct acp_child acp_child;

/* Each turn of a session whose provider is `[provider.NAME] type = acp` runs a fresh child configured by
 * that section: command (required: a program looked up in PATH, or an absolute path), args (a comma-separated
 * list; "\," is a comma, "\\" a backslash, "\ " a kept space), env (comma-separated NAME=value added to the
 * core's allowlist), pass_env (names of the host's variables copied when set), cwd (absolute; default the
 * session's cwd) and handshake_timeout_ms (default 30000). docs/protocols/acp.md, "The acp provider". */

/* Register the provider type "acp" (api->register_provider). `config` is the [plugin.acp] object
 * (borrowed). Returns 0 or a negative AH_E* code; on error nothing is left allocated. */
int acp_child_mount(ah_mount *m, const ah_host_api *api, const json_t *config, acp_child **out);

/* Withdraw: dispose every child still running (session/cancel once, stdin EOF, SIGTERM, SIGKILL on the
 * process group) and call `done(arg)` once, on the loop thread, after every child's exit was observed and
 * every handle is closed; then free `c`. `done` may run before this returns. */
void acp_child_withdraw(acp_child *c, void (*done)(void *arg), void *arg);

#endif
