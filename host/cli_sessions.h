/* agenthost — the command line's sessions viewer (cli_sessions.c; internal). */
#ifndef AGENTHOST_HOST_CLI_SESSIONS_H
#define AGENTHOST_HOST_CLI_SESSIONS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/* `agenthost sessions SUB [ID] [--json]` on the store of `cfg` (SUB: list, show, export; ID for show and
 * export). Returns the process's exit code: 0, or 1 (the store cannot be read, no such session). */
int ah__cli_sessions(const ah_config *cfg, const char *sub, const char *id, bool as_json);

/* `agenthost sessions delete ID`: a closed session removed through the running daemon (session.delete, so
 * its surfaces hear of it), else, without a daemon, from the store of `cfg` directly. 0, or 1 (no such
 * session, the session is open, the store cannot be written). */
int ah__cli_sessions_delete(const ah_config *cfg, const char *id);

/* `s` with every control character, backslash and invalid UTF-8 byte escaped (the log's rules), cut to at
 * most `max` characters (0 = no limit) with "..." when cut; malloc'ed, never NULL ("" on failure). */
char *ah__cli_esc(const char *s, size_t max);
const char *ah__cli_jstr(const json_t *o, const char *k);

#endif
