/* Helpers shared by the unit tests. */
#ifndef AGENTHOST_TEST_SUPPORT_H
#define AGENTHOST_TEST_SUPPORT_H

#include <jansson.h>
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

/* ---- stdio peers: the real agenthost ($AH_TEST_AGENTHOST) spoken to over pipes in JSON Lines ---------- */

/* A child `agenthost … <mode>` on two pipes, with private state under `dir`. */
typedef struct ts_stdio {
  pid_t pid;
  int in;     /* the host's stdin (we write); -1 once closed */
  int out;    /* the host's stdout (we read) */
  char *dir;  /* --state-dir; also holds run/ (--runtime-dir) and empty.ini (--config) */
  char *work; /* a directory of its own (outside the state dir), made for sessions' cwd */
  char *log;  /* dir/host.log: the host's stderr */
  char *buf;  /* bytes read from `out` that are not yet a whole line */
  size_t len, cap;
  bool eof;          /* `out` has ended */
  size_t json_flags; /* json_loadb flags for ts_stdio_next_msg */
  /* Called on every return of ts_stdio_next_msg (may be NULL): the message, or NULL on timeout or EOF. */
  void (*check)(const struct ts_stdio *h, const json_t *msg);
} ts_stdio;

/* $AH_TEST_AGENTHOST; the test fails when it is not set. */
const char *ts_agenthost(void);

/* Fresh directory, work dir, log path and empty config; no process yet (pid -1, fds -1). */
void ts_stdio_prepare(ts_stdio *h);

/* In a child: exec `agenthost --state-dir … --runtime-dir … --config … <mode>` with stdin/stdout on
 * `in_fd`/`out_fd` and stderr appended to the log, every other descriptor closed. `env` (may be NULL) is one
 * extra "NAME=value". Never returns. */
void ts_stdio_exec(const ts_stdio *h, int in_fd, int out_fd, const char *mode, const char *env)
    __attribute__((noreturn));

/* Fork and exec (ts_stdio_exec) on fresh pipes; the child gets PR_SET_PDEATHSIG(SIGKILL) before the exec.
 * SIGPIPE is ignored in the test process from then on. */
void ts_stdio_spawn(ts_stdio *h, const char *mode, const char *env);

/* ts_stdio_prepare, then ts_stdio_spawn. */
void ts_stdio_start(ts_stdio *h, const char *mode, const char *env);

/* Close the host's stdin (an EOF for it). */
void ts_stdio_close_stdin(ts_stdio *h);

/* Close both pipes, SIGKILL and reap the process; the directory is kept (for a restart on the same state). */
void ts_stdio_end(ts_stdio *h);

/* ts_stdio_end, then remove the directory and free everything. */
void ts_stdio_free(ts_stdio *h);

void ts_stdio_send_raw(ts_stdio *h, const char *bytes, size_t n);
void ts_stdio_send_line(ts_stdio *h, const char *line);
/* `msg` as one compact line (not stolen). */
void ts_stdio_send_json(ts_stdio *h, const json_t *msg);

/* The next line from the host (without its newline) as JSON, NULL on timeout or EOF; the test fails on a
 * line that is not JSON. h->check sees what is returned. */
json_t *ts_stdio_next_msg(ts_stdio *h, uint64_t timeout_ms);

/* The host's log must hold no sanitizer report (the unit suite also runs under ASan + UBSan). */
void ts_stdio_check_log(const ts_stdio *h);

/* Stop a host whose stdout is not being read, the way `how` says: "eof" (close stdin), "SIGTERM" or
 * "SIGINT". Returns the wait status, or -1 when it did not exit within `timeout_ms` (it is then killed). */
int ts_stdio_stop_unread(ts_stdio *h, const char *how, uint64_t timeout_ms);

/* JSON-RPC 2.0: a response (result or error, no method)? */
bool ts_rpc_is_response(const json_t *m);
const char *ts_rpc_method(const json_t *m);
int ts_rpc_error_code(const json_t *r);

/* The next response, NULL on timeout; every other message is passed to `on_other` (may be NULL), then
 * dropped. */
json_t *ts_stdio_next_response(ts_stdio *h, uint64_t timeout_ms,
                               void (*on_other)(ts_stdio *h, json_t *m, void *arg), void *arg);

/* The response to the request `id` the caller sent (`method` names it in a failure): it must come within
 * 10 s and carry that id. */
json_t *ts_stdio_answer(ts_stdio *h, int id, const char *method);

#endif
