/* Helpers shared by the unit tests. */
#ifndef AGENTHOST_TEST_SUPPORT_H
#define AGENTHOST_TEST_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

/* A fresh directory under $TMPDIR (or /tmp), mode 0700; the caller frees the string. The directory and
 * its contents are removed by ts_rmtree(). */
char *ts_mkdtemp(void);
void ts_rmtree(const char *path);

/* Write `text` to `dir/name`; returns the malloc'ed full path. */
char *ts_write_file(const char *dir, const char *name, const char *text);

/* Run `loop` until *flag is true or `timeout_ms` elapsed; returns *flag. */
bool ts_run_until(uv_loop_t *loop, volatile bool *flag, uint64_t timeout_ms);

/* Run `loop` until `pred(arg)` is true or `timeout_ms` elapsed; returns the last value of pred. */
bool ts_run_until_pred(uv_loop_t *loop, bool (*pred)(void *arg), void *arg, uint64_t timeout_ms);

/* Run `loop` until nothing is pending (at most 2 s; nothing is closed on the caller's behalf) and return
 * uv_loop_close()'s result. */
int ts_loop_close(uv_loop_t *loop);

/* Path of a fixture plugin built in tests/plugins ("ok" → .../tests/plugins/ok.so); static storage. */
const char *ts_plugin(const char *name);

/* Monotonic milliseconds. */
uint64_t ts_now_ms(void);

/* Number of open file descriptors of this process. */
int ts_count_fds(void);

/* ---- child processes (integration tests that drive the agenthost binary) ---------------------------- */

/* Start argv[0] (a path) with `argv`: stdin is /dev/null, stdout and stderr go to the files `out_path` and
 * `err_path` (created or appended; NULL = /dev/null), every other descriptor is closed. The child gets
 * SIGKILL when the test process dies, and is recorded so that ts_kill_all() can stop it. Returns the pid,
 * or -1. */
pid_t ts_spawn(char *const argv[], const char *out_path, const char *err_path);

/* Wait up to `timeout_ms` for `pid` to exit; true (and *status, may be NULL, the waitpid status) when it
 * did and was reaped. */
bool ts_wait_exit(pid_t pid, uint64_t timeout_ms, int *status);

/* Send `sig`, wait up to `grace_ms`, then SIGKILL and reap. Returns the waitpid status, -1 when `pid` was
 * not a child. */
int ts_stop(pid_t pid, int sig, uint64_t grace_ms);

/* SIGKILL and reap every child of ts_spawn() that is still running (for a test's .fini). */
void ts_kill_all(void);

/* Run `argv` to completion, at most `timeout_ms` (then it is killed). Returns its exit code, or -1 when it
 * was killed by a signal, timed out or could not be started. *out and *err (each may be NULL) receive its
 * stdout and stderr (malloc'ed, NUL-terminated). */
int ts_run(char *const argv[], uint64_t timeout_ms, char **out, char **err);

/* The whole file as malloc'ed, NUL-terminated bytes (*len, may be NULL, its length without the NUL);
 * NULL when it cannot be read. */
char *ts_read_file(const char *path, size_t *len);

/* Poll every 10 ms until `path` exists; true when it did within `timeout_ms`. */
bool ts_wait_path(const char *path, uint64_t timeout_ms);

/* Processes of process group `pgid` that are alive (zombies do not count), from /proc; -1 when /proc
 * cannot be read. */
int ts_group_members(pid_t pgid);

/* For ts_run_until_pred (arg: a pid_t *): reap what of the group was reparented to us (a subreaper) and
 * tell whether the group is gone. */
bool ts_group_gone(void *arg);

#endif
