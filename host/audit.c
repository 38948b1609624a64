/* The audit log: one JSON line per privileged call (method, caller, outcome; never values), appended to
 * state_dir/audit.log. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

void ah__audit_open(ah_host *h) {
  char path[4096];
  snprintf(path, sizeof path, "%s/audit.log", h->config->state_dir);
  if (ah__mkdirs(h->config->state_dir, NULL) == 0)
    h->audit_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (h->audit_fd < 0)
    AH_LOG_W("host", "cannot open the audit log %s: %s", path, strerror(errno));
}

static const char *authority_name(ah_authority a) {
  switch (a) {
  case AH_AUTH_LAN:
    return "lan";
  case AH_AUTH_LOOPBACK:
    return "loopback";
  case AH_AUTH_STDIO_OWNER:
    return "stdio-owner";
  case AH_AUTH_ADMIN:
    return "admin";
  default:
    return "invalid";
  }
}

void ah__audit(ah_host *h, const char *method, const ah_caller *caller, int status) {
  if (!h || h->audit_fd < 0)
    return;
  char when[32];
  ah__time_rfc3339(when);
  /* JSON escapes whatever a method name or surface contains, so a record is always one line. */
  json_t *rec =
      json_pack("{s:s, s:s, s:s, s:s, s:I, s:s}", "time", when, "method", method, "surface",
                caller->surface ? caller->surface : "", "authority", authority_name(caller->authority),
                "connection", (json_int_t)caller->connection_id, "outcome", ah_err_name(status));
  char *line = rec ? json_dumps(rec, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
  json_decref(rec);
  if (!line)
    return;
  size_t n = strlen(line);
  line[n] = '\n';
  /* One write of a line opened O_APPEND: records never interleave. */
  if (write(h->audit_fd, line, n + 1) < 0)
    AH_LOG_W("host", "cannot write the audit log: %s", strerror(errno));
  free(line);
}

void ah__audit_close(ah_host *h) {
  if (h->audit_fd >= 0)
    close(h->audit_fd);
  h->audit_fd = -1;
}
