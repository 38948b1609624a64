/* agenthost plugins — the check of an environment variable's name ([A-Za-z_][A-Za-z0-9_]*), compiled into the
 * plugins that give their children variables of their configuration (acp, mcp). */
#ifndef AGENTHOST_PLUGINS_ENVNAME_H
#define AGENTHOST_PLUGINS_ENVNAME_H

#include <stdbool.h>
#include <stddef.h>

/* The first `n` bytes of `s` are a variable name. */
bool env_name_valid(const char *s, size_t n);

#endif
