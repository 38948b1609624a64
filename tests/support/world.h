/* A host with a state directory on a private loop for the sessions' tests (unit tests): real store files,
 * the real echo provider, the real tools; calls as the admin, the session's stored events, waits. */
#ifndef AGENTHOST_TEST_WORLD_H
#define AGENTHOST_TEST_WORLD_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "host.h"

typedef struct world {
  uv_loop_t loop;
  char *dir;
  char *state;
  char *work; /* a session cwd */
  ah_config cfg;
  ah_host *h;
  json_t *events; /* every bus event seen: [[name, data], ...] */
  ah_sub *sub;
} world;

void world_up(world *w); /* the host is made with w->cfg as set before (state_dir, default_provider) */
/* The same with the configuration's hooks (stolen; as ah_config.hooks holds them). */
void world_up_hooks(world *w, json_t *hooks);
void world_down(world *w);
ah_host *host_on(world *w);
void on_bus(const char *name, const json_t *data, void *arg);
/* Call and require success; returns the result (owned). */
json_t *ok_call(world *w, const char *method, json_t *params);
int err_call(world *w, const char *method, json_t *params);
char *create(world *w);                                           /* a session in w->work; its id (owned) */
char *prompt(world *w, const char *id, const char *text);         /* its messageId (owned) */
json_t *history(world *w, const char *id);                        /* the stored events (owned) */
json_t *find_kind(json_t *events, const char *kind, size_t from); /* borrowed */
bool has_kind(void *arg);
/* A predicate for ts_run_until_pred: a bus event `name` was seen (with the data key `key`, when set). */
typedef struct bus_wait {
  world *w;
  const char *name;
  const char *key;
} bus_wait;
bool bus_published(void *arg);
void wait_for(world *w, const char *id, const char *kind, int count);
json_t *pending_requests(world *w, const char *id);
bool has_request(void *arg);
json_t *wait_request(world *w, const char *id);
json_t *respond_as(world *w, uint64_t conn, json_t *params);
json_t *last_data(json_t *events, const char *kind); /* the data of the last event of `kind`, borrowed */

#endif
