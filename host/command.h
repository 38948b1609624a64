/* agenthost — one command run to its end (internal): the child of the run_command tool and of a command
 * hook.
 *
 * The child runs through the host's process service on the core's mount (environment allowlist + the
 * given extras, its own process group), in `cwd`, with `input` written to its stdin and then closed (or
 * /dev/null), its stdout and stderr read up to `max_output` bytes each (the rest is read and dropped, so it
 * never blocks), a timeout, and a cancellation token: on either, the whole group gets SIGTERM, then SIGKILL
 * after `kill_grace_ms`; a stopping host kills it without grace. The outcome is reported once the exit was
 * observed and the pipes are closed. A run holds the core's withdraw like a call.
 */
#ifndef AGENTHOST_HOST_COMMAND_H
#define AGENTHOST_HOST_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host.h"

typedef struct ah_command_opts {
  const char *const *argv; /* NULL-terminated; argv[0] the program (looked up in PATH without a slash) */
  const char *const *env;  /* "NAME=value" added to the allowlist; may be NULL */
  const char *cwd;         /* absolute */
  const char *input;       /* written to stdin, then EOF; NULL = stdin is /dev/null */
  size_t input_len;
  size_t max_output;      /* per stream */
  uint64_t timeout_ms;    /* 0 = none */
  uint64_t kill_grace_ms; /* SIGTERM → SIGKILL on timeout or cancel */
  ah_cancel *cancel;      /* may be NULL */
  /* Each chunk of output as it is read (stream 0 = stdout, 1 = stderr; what fits under max_output), on the
   * loop thread, before the result; may be NULL. The bytes are borrowed for the call. */
  void (*on_output)(void *arg, int stream, const char *data, size_t len);
  void *output_arg;
} ah_command_opts;

typedef struct ah_command_result {
  const char *error; /* the command could not run (it did not start): why; the rest is then zero */
  int64_t exit_code; /* when signal == 0 */
  int signal;        /* the signal that ended it, or 0 */
  const char *out;   /* stdout, stderr (not NUL-terminated) */
  size_t out_len;
  const char *err;
  size_t err_len;
  bool truncated; /* a stream passed max_output */
  bool timed_out;
  bool cancelled; /* the token tripped, or the host stopped */
  uint64_t duration_ms;
} ah_command_result;

/* `r` and its buffers are borrowed for the call. */
typedef void (*ah_command_fn)(const ah_command_result *r, void *arg);

/* Returns 0 and `cb` runs exactly once on a later loop turn (a command that cannot start is reported
 * through it with `error`), or AH_EINVAL (no argv or cwd) / AH_ENOMEM without calling it. A token already
 * tripped reports `cancelled` without starting anything. */
int ah__command_run(ah_host *h, const ah_command_opts *o, ah_command_fn cb, void *arg);

#endif
