/* The real agenthost binary as a daemon for the system tests: its own state and runtime directories, a
 * config file, its log; started, called through the admin socket and stopped (tests/system). */
#ifndef AGENTHOST_TESTS_DAEMON_H
#define AGENTHOST_TESTS_DAEMON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The daemon's default plugins (browser, remote) are not built yet; a config that does not mention them
 * leaves them enabled, and the daemon warns and goes on. The tests name them only where it matters. */
#define NO_DEFAULT_PLUGINS \
  "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n[plugin.mcp]\nenabled = false\n"

typedef struct test_daemon {
  char *dir;    /* private root, removed at the end */
  char *state;  /* --state-dir */
  char *run;    /* --runtime-dir */
  char *config; /* --config */
  char *log;    /* the daemon's stderr */
  char *out;    /* the daemon's stdout */
  char *sock;   /* run/admin.sock */
  pid_t pid;
} test_daemon;

/* Every daemon of the running test, so that the .fini (d_cleanup) can clean up after a failed assertion. */
extern test_daemon *d_live[4];

void d_cleanup(void);
const char *d_env_path(const char *name);
char *d_join(const char *a, const char *b);
test_daemon *d_new(const char *config_text);
void d_write_config(test_daemon *d, const char *config_text);
pid_t d_spawn_serve(test_daemon *d, const char *log);
char *d_log(test_daemon *d);
bool d_log_has(test_daemon *d, const char *needle);
bool d_log_wait(test_daemon *d, const char *needle, uint64_t timeout_ms);
void d_start(test_daemon *d);
int d_stop(test_daemon *d);
void assert_clean_exit(test_daemon *d, int st);
int d_cli(test_daemon *d, char **out, char **err, ...);
json_t *d_call_ok(test_daemon *d, const char *method, json_t *params);
void d_new_session(test_daemon *d, const char *cwd, char *sid, size_t cap);
const char *event_kind_of(const json_t *m);

#endif
