/* agenthost — commands that plugins add to the command line (cli_commands.c; internal). */
#ifndef AGENTHOST_HOST_CLI_COMMANDS_H
#define AGENTHOST_HOST_CLI_COMMANDS_H

#include <stdbool.h>

#include "config.h"

/* `agenthost NAME ARGS…` for a NAME the host does not know: the enabled plugin (in config order) whose
 * module offers a command NAME (ah_plugin_desc.commands, ABI 1.3) runs it, loaded but not mounted.
 * argv[0] is NAME. Returns the command's exit status; *found is false (and nothing ran) when no enabled
 * plugin offers NAME. */
int ah__cli_plugin_command(const ah_config *cfg, int argc, char **argv, bool *found);

#endif
