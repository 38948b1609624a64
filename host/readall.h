/* agenthost — reading a stream to its end, bounded (internal; in the agenthost-jsonrpc library target, so
 * the core and the clients share it). */
#ifndef AGENTHOST_HOST_READALL_H
#define AGENTHOST_HOST_READALL_H

#include <stddef.h>
#include <stdio.h>

/* Read `f` to its end into a malloc'ed, NUL-terminated buffer (*out, *len bytes without the NUL). Returns
 * 0; AH_E2BIG when it holds more than `max` bytes; AH_EIO on a read error; AH_ENOMEM. *out is NULL on
 * failure. */
int ah__read_all(FILE *f, size_t max, char **out, size_t *len);

#endif
