/* See pg_support.h. */
#include "pg_support.h"

#include <criterion/criterion.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

bool tpg_enabled(void) {
  const char *u = getenv("AH_TEST_PG");
  return u && *u;
}

const char *tpg_password(void) {
  return getenv("AH_TEST_PG_PASSWORD");
}

static PGconn *connect_url(const char *url) {
  const char *keys[] = {"dbname", "password", NULL};
  const char *vals[] = {url, tpg_password(), NULL};
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  cr_assert(c && PQstatus(c) == CONNECTION_OK, "cannot connect to the test cluster: %s",
            c ? PQerrorMessage(c) : "out of memory");
  return c;
}

static PGresult *run(const char *url, const char *sql, ExecStatusType want) {
  PGconn *c = connect_url(url);
  PGresult *r = PQexec(c, sql);
  cr_assert(r && PQresultStatus(r) == want, "%s: %s", sql, PQerrorMessage(c));
  PQfinish(c);
  return r;
}

static char *admin_url(void) {
  char *u = NULL;
  cr_assert(asprintf(&u, "%s dbname=postgres", getenv("AH_TEST_PG")) > 0);
  return u;
}

char *tpg_create_db(char *name) {
  static unsigned counter;
  snprintf(name, 64, "t_%ld_%u_%ld", (long)getpid(), counter++, (long)random() % 100000);
  char *admin = admin_url();
  char sql[128];
  snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
  PQclear(run(admin, sql, PGRES_COMMAND_OK));
  free(admin);
  char *u = NULL;
  cr_assert(asprintf(&u, "%s dbname=%s", getenv("AH_TEST_PG"), name) > 0);
  return u;
}

void tpg_drop_db(const char *name) {
  char *admin = admin_url();
  char sql[128];
  snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", name);
  PQclear(run(admin, sql, PGRES_COMMAND_OK));
  free(admin);
}

int64_t tpg_int(const char *url, const char *sql) {
  PGresult *r = run(url, sql, PGRES_TUPLES_OK);
  cr_assert(PQntuples(r) > 0, "%s: no row", sql);
  int64_t v = PQgetisnull(r, 0, 0) ? 0 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
  PQclear(r);
  return v;
}

char *tpg_text(const char *url, const char *sql) {
  PGresult *r = run(url, sql, PGRES_TUPLES_OK);
  cr_assert(PQntuples(r) > 0, "%s: no row", sql);
  char *v = strdup(PQgetisnull(r, 0, 0) ? "" : PQgetvalue(r, 0, 0));
  PQclear(r);
  return v;
}

void tpg_exec(const char *url, const char *sql) {
  PGconn *c = connect_url(url);
  PGresult *r = PQexec(c, sql);
  ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  cr_assert(s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK, "%s: %s", sql, PQerrorMessage(c));
  PQclear(r);
  PQfinish(c);
}

pid_t tpg_proxy_start(const char *dir, const char *db, char **url) {
  const char *pg = getenv("AH_TEST_PG");
  const char *pp = pg ? strstr(pg, "port=") : NULL;
  const char *root = getenv("AH_TEST_SOURCE_ROOT");
  cr_assert(pp && root, "AH_TEST_PG (with a port) and AH_TEST_SOURCE_ROOT are needed");
  char target[16], *script = NULL, *out = NULL;
  snprintf(target, sizeof target, "%d", atoi(pp + 5));
  cr_assert(asprintf(&script, "%s/tests/support/tcp_proxy.py", root) > 0);
  cr_assert(asprintf(&out, "%s/proxy.out", dir) > 0);
  char *argv[] = {"/usr/bin/python3", script, target, NULL};
  pid_t proxy = ts_spawn(argv, out, NULL);
  cr_assert_gt(proxy, 0, "cannot start the proxy");
  int port = 0;
  for (uint64_t end = ts_now_ms() + 10000; !port && ts_now_ms() < end; usleep(50 * 1000)) {
    char *text = ts_read_file(out, NULL);
    if (text && strncmp(text, "port ", 5) == 0)
      port = atoi(text + 5);
    free(text);
  }
  cr_assert_gt(port, 0, "the proxy did not start");
  cr_assert(asprintf(url, "host=127.0.0.1 port=%d user=agenthost dbname=%s", port, db) > 0);
  free(script);
  free(out);
  return proxy;
}

void tpg_proxy_stop(pid_t proxy) {
  kill(proxy, SIGTERM);
  int st = 0;
  ts_wait_exit(proxy, 5000, &st);
}
