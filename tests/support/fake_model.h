/* The scripted OpenAI-compatible server of the tests (tests/fakes/fake_model.py), started and stopped by
 * the test itself on 127.0.0.1; scripted and read through its plain-HTTP control port. */
#ifndef AGENTHOST_TEST_FAKE_MODEL_H
#define AGENTHOST_TEST_FAKE_MODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

typedef struct ts_fake {
  pid_t pid;
  int port;         /* the service port (TLS when started with a certificate) */
  int control_port; /* plain HTTP, control requests only */
  char *dir;        /* its private directory (removed by ts_fake_stop) */
  char base[64];    /* "http://127.0.0.1:PORT" or "https://localhost:PORT" */
} ts_fake;

/* Start the server; with cert/key (PEM files) over TLS. Asserts on failure. */
void ts_fake_start(ts_fake *f, const char *cert, const char *key);
/* Replace its script with `steps` (a JSON array of steps, as text). */
void ts_fake_script(ts_fake *f, const char *steps);
/* GET /_control/requests or /_control/events: a new reference. */
json_t *ts_fake_get(ts_fake *f, const char *what);
void ts_fake_stop(ts_fake *f);
/* The time (CLOCK_REALTIME seconds, the server's clock) of the first client disconnect the server saw
 * while it was still sending, waiting up to 2 s for it; 0 when none. */
double ts_fake_disconnect_time(ts_fake *f);
/* The same clock now, to compare with it. */
double ts_wall_now(void);

/* A TCP port of 127.0.0.1 that nobody listens on (bound, read, closed). */
int ts_free_port(void);

/* Make a CA and a certificate for localhost/127.0.0.1 signed by it in `dir` with openssl:
 * dir/ca.pem, dir/cert.pem, dir/key.pem; and a second, unrelated CA dir/other-ca.pem. */
void ts_make_certs(const char *dir);

#endif
