/* agenthost — the acp plugin: the Agent Client Protocol v1 agent side on stdio (`agenthost acp`, agent.c)
 * and the `acp` provider that runs external ACP agents as children (child.c).
 *
 * The provider is registered in every mode; the stdio agent starts only when the host runs in acp mode
 * (api->host_mode), so that a daemon that enables the plugin only gets the provider. withdraw() ends the
 * stdio side first (its prompts answered, its peer flushed and closed), then the children, then reports
 * done. All state lives in one `acp_plugin` object behind the state pointer.
 */
#include <agenthost/errors.h>
#include <agenthost/plugin.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "child.h"

typedef struct acp_plugin {
  ah_mount *m;
  const ah_host_api *api;
  acp_agent *agent; /* NULL outside acp mode */
  acp_child *child;
  ah_withdraw_done_fn done;
} acp_plugin;

/* The host's mode; a host without the ABI 1.1 entry runs this plugin only as `agenthost acp`. */
static const char *host_mode(ah_mount *m, const ah_host_api *api) {
  const char *mode = AH_HAS(api, ah_host_api, host_mode) ? api->host_mode(m) : NULL;
  return mode ? mode : "acp";
}

static int acp_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  acp_plugin *p = calloc(1, sizeof *p);
  if (!p)
    return AH_ENOMEM;
  p->m = m;
  p->api = api;
  int rc = acp_child_mount(m, api, config, &p->child);
  if (rc) {
    free(p);
    return rc;
  }
  if (strcmp(host_mode(m, api), "acp") == 0) {
    rc = acp_agent_start(m, api, config, &p->agent);
    if (rc) {
      /* mount() failed: withdraw() is not called, so the provider side is reclaimed here. */
      api->log(m, AH_PLOG_ERROR, "the ACP agent could not start: %s", ah_strerror(rc));
      acp_child_withdraw(p->child, free, p);
      return rc;
    }
  }
  *state = p;
  return 0;
}

static void child_done(void *arg) {
  acp_plugin *p = arg;
  ah_mount *m = p->m;
  ah_withdraw_done_fn done = p->done;
  free(p);
  done(m);
}

static void agent_done(void *arg) {
  acp_plugin *p = arg;
  p->agent = NULL;
  acp_child_withdraw(p->child, child_done, p);
}

static void acp_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  (void)m;
  acp_plugin *p = state;
  p->done = done;
  if (p->agent)
    acp_agent_stop(p->agent, agent_done, p);
  else
    agent_done(p);
}

static const ah_plugin_desc acp_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "acp",
    .version = "0.1.0",
    .description = "Agent Client Protocol v1: the agent side on stdin/stdout and the acp provider",
    .mount = acp_mount,
    .withdraw = acp_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  if (AH_ABI_MAJOR_OF(host_abi) != AH_ABI_MAJOR)
    return NULL;
  return &acp_desc;
}
