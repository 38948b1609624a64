/* agenthost — the admin channel (internal): a Unix socket in the runtime directory speaking the JSON-RPC
 * peer with admin authority, and the client the CLI uses to reach a running daemon. */
#ifndef AGENTHOST_HOST_ADMIN_H
#define AGENTHOST_HOST_ADMIN_H

#include <jansson.h>

#include "host.h"

typedef struct ah_admin ah_admin;

/* Create `dir` (and missing parents) with mode 0700 and check it: a directory, not a symlink, owned by
 * this user, no group/other access (fixed when it is ours). Returns 0 or AH_EPERM / AH_EIO with *why. */
int ah__runtime_dir_prepare(const char *dir, char **why);

/* Take the one-daemon-per-runtime-dir lock (runtime_dir/serve.lock, holding our pid). Returns the lock
 * fd, or AH_EBUSY with *why naming the running pid, or AH_EIO. */
int ah__runtime_lock(const char *dir, char **why);

/* `agenthost stop`: SIGTERM to the daemon holding runtime_dir/serve.lock (its pid in *pid), then wait up to
 * `timeout_ms` (0: forever) until it has exited (the lock is free). 0; AH_ENOENT when no daemon runs;
 * AH_ETIMEDOUT; AH_EIO (the lock file or the signal failed); *why says which. */
int ah__runtime_stop(const char *dir, uint64_t timeout_ms, long *pid, char **why);

/* Listen on runtime_dir/admin.sock (0600). Every request is dispatched with caller {surface "admin",
 * authority ADMIN}. Returns 0 or AH_EIO / AH_E2BIG (path too long) with *why. */
int ah__admin_start(ah_host *h, const char *runtime_dir, ah_admin **out, char **why);

/* Close the listener and every connection (their in-flight calls are cancelled); `cb` runs when every
 * handle is closed, then the admin object is freed. */
void ah__admin_stop(ah_admin *a, void (*cb)(void *arg), void *arg);

/* Client: connect to runtime_dir/admin.sock, send one request, wait up to `timeout_ms` for the answer.
 * On success *result is the value (new reference). On failure returns AH_ECLOSED with *error NULL (no
 * daemon answers), AH_ETIMEDOUT, or the answer's code with *error = the JSON-RPC error object (new
 * reference): the AH_E* its data.name says ("ENOENT" → AH_ENOENT), else AH_EPROTO. */
int ah__admin_call(const char *runtime_dir, const char *method, json_t *params, uint64_t timeout_ms,
                   json_t **result, json_t **error);

#endif
