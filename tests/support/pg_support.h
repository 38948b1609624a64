/* Tests against PostgreSQL: the cluster that tests/support/with_pg.sh started for this run, a fresh database
 * per test, and raw SQL beside the store (checks the store's own reads cannot make). Only built when the
 * PostgreSQL backend is. */
#ifndef AGENTHOST_TESTS_PG_SUPPORT_H
#define AGENTHOST_TESTS_PG_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Whether this run is against PostgreSQL (AH_TEST_PG is set by with_pg.sh). */
bool tpg_enabled(void);
/* The password of the cluster's superuser (AH_TEST_PG_PASSWORD). */
const char *tpg_password(void);
/* A new empty database; returns its connection string (malloc'ed, without the password) and its name in
 * `name` (at least 64 bytes). Asserts on failure. */
char *tpg_create_db(char *name);
/* Drop a database made by tpg_create_db, ending its connections first. */
void tpg_drop_db(const char *name);
/* Raw SQL on the database of `url` (asserting success): the first column of the first row as an integer or
 * as text (malloc'ed; "" for NULL), or a statement run for its effect. */
int64_t tpg_int(const char *url, const char *sql);
char *tpg_text(const char *url, const char *sql);
void tpg_exec(const char *url, const char *sql);

/* tests/support/tcp_proxy.py in front of the cluster, its output in DIR/proxy.out: its pid (SIGUSR1: drop
 * everything, SIGUSR2: forward again, SIGTERM: stop), and the connection string of database `db` through it
 * (malloc'ed, into *url). Asserts on failure. */
pid_t tpg_proxy_start(const char *dir, const char *db, char **url);
/* Stop that proxy and wait for it. */
void tpg_proxy_stop(pid_t proxy);

#endif
