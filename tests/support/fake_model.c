/* Starting, scripting and reading the fake model server (fake_model.h). */
#include "fake_model.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "support.h"
#include "ws_client.h"

static int read_port(const char *path) {
  char *text = ts_read_file(path, NULL);
  int port = text ? atoi(text) : 0;
  free(text);
  return port;
}

void ts_fake_start(ts_fake *f, const char *cert, const char *key) {
  memset(f, 0, sizeof *f);
  const char *src = getenv("AH_TEST_SOURCE_ROOT");
  cr_assert(src && *src, "AH_TEST_SOURCE_ROOT is not set");
  f->dir = ts_mkdtemp();
  cr_assert_not_null(f->dir);
  char script[4096], port_file[4096], control_file[4096], err[4096];
  snprintf(script, sizeof script, "%s/tests/fakes/fake_model.py", src);
  snprintf(port_file, sizeof port_file, "%s/port", f->dir);
  snprintf(control_file, sizeof control_file, "%s/control-port", f->dir);
  snprintf(err, sizeof err, "%s/stderr", f->dir);
  char *argv[12] = {"/usr/bin/python3",    script,       "--port-file", port_file,
                    "--control-port-file", control_file, NULL};
  if (cert) {
    argv[6] = "--tls";
    argv[7] = (char *)cert;
    argv[8] = (char *)key;
    argv[9] = NULL;
  }
  f->pid = ts_spawn(argv, NULL, err);
  cr_assert_gt(f->pid, 0);
  cr_assert(ts_wait_path(port_file, 10000), "the fake model server did not start");
  f->port = read_port(port_file);
  f->control_port = read_port(control_file);
  cr_assert(f->port > 0 && f->control_port > 0);
  snprintf(f->base, sizeof f->base, "%s://%s:%d", cert ? "https" : "http", cert ? "localhost" : "127.0.0.1",
           f->port);
}

static char *control(ts_fake *f, const char *method, const char *path, const char *body) {
  int fd = tc_connect(f->control_port, 0);
  cr_assert(fd >= 0, "the fake model server's control port refused");
  char *req = NULL;
  cr_assert(asprintf(&req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     method, path, body ? strlen(body) : 0, body ? body : "") > 0);
  cr_assert(tc_send_str(fd, req));
  free(req);
  tc_resp r;
  int st = tc_read_response(fd, &r, 10000);
  close(fd);
  cr_assert_eq(st, 200, "%s %s: %d %s", method, path, st, st > 0 ? r.body : "");
  char *out = strndup(r.body ? r.body : "", r.body_len);
  tc_resp_free(&r);
  return out;
}

void ts_fake_script(ts_fake *f, const char *steps) {
  free(control(f, "POST", "/_control/script", steps));
}

json_t *ts_fake_get(ts_fake *f, const char *what) {
  char path[64];
  snprintf(path, sizeof path, "/_control/%s", what);
  char *text = control(f, "GET", path, NULL);
  json_t *j = json_loads(text, 0, NULL);
  free(text);
  cr_assert_not_null(j);
  return j;
}

double ts_fake_disconnect_time(ts_fake *f) {
  for (int i = 0; i < 100; i++) {
    json_t *ev = ts_fake_get(f, "events");
    double seen = 0;
    size_t k = 0;
    json_t *e = NULL;
    json_array_foreach(ev, k, e) {
      if (!seen && strcmp(json_string_value(json_object_get(e, "event")), "disconnect") == 0)
        seen = json_real_value(json_object_get(e, "time"));
    }
    json_decref(ev);
    if (seen)
      return seen;
    usleep(20 * 1000);
  }
  return 0;
}

double ts_wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int ts_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  socklen_t n = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &n);
  close(fd);
  return ntohs(a.sin_port);
}

void ts_fake_stop(ts_fake *f) {
  if (f->pid > 0)
    ts_stop(f->pid, SIGTERM, 5000);
  f->pid = 0;
  if (f->dir) {
    ts_rmtree(f->dir);
    free(f->dir);
    f->dir = NULL;
  }
}

static void sh(const char *dir, const char *cmd) {
  char *full = NULL;
  cr_assert(asprintf(&full, "cd '%s' && %s >/dev/null 2>&1", dir, cmd) > 0);
  int rc = system(full);
  cr_assert_eq(rc, 0, "failed: %s", full);
  free(full);
}

void ts_make_certs(const char *dir) {
  sh(dir, "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=agenthost-test-ca "
          "-keyout ca-key.pem -out ca.pem");
  sh(dir, "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout key.pem -out cert.csr");
  sh(dir, "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext.cnf && "
          "openssl x509 -req -in cert.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 "
          "-extfile ext.cnf -out cert.pem");
  sh(dir, "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
          "-keyout other-ca-key.pem -out other-ca.pem");
}
