/* agenthost browser plugin — the token and the discovery file (SECURITY.md §2.2, DECISIONS.md "Process,
 * files, command line").
 *
 * The token is 32 bytes from getrandom(2), kept base64url-encoded in state_dir/token (0600), created on the
 * first start and reused, so that open tabs reconnect after a restart; `token_file` (--token-file) names
 * another file, which is created the same way when it does not exist. A file that others may read, or that
 * does not hold exactly one token, is refused. The discovery file runtime_dir/serve.json (0600,
 * O_EXCL|O_NOFOLLOW) holds {url, port, pid} — never the token.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "browser.h"

static int read_token(bp_state *st, const char *path, int fd) {
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st->api->log(st->m, AH_PLOG_ERROR, "token file %s: not a regular file", path);
    return AH_ECONFIG;
  }
  if (sb.st_uid != geteuid() || (sb.st_mode & 077) != 0) {
    st->api->log(st->m, AH_PLOG_ERROR,
                 "token file %s: must belong to this user and be readable by no one else (mode 0600)", path);
    return AH_ECONFIG;
  }
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  if (n < 0) {
    st->api->log(st->m, AH_PLOG_ERROR, "token file %s: %s", path, strerror(errno));
    return AH_EIO;
  }
  size_t len = (size_t)n;
  while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
    len--;
  if (!bf_token_decode(buf, len, st->token)) {
    st->api->log(st->m, AH_PLOG_ERROR, "token file %s: does not hold a token (43 base64url characters)",
                 path);
    return AH_ECONFIG;
  }
  return 0;
}

static int random_bytes(uint8_t t[BF_TOKEN_BYTES]) {
  size_t got = 0;
  while (got < BF_TOKEN_BYTES) {
    ssize_t n = getrandom(t + got, BF_TOKEN_BYTES - got, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return AH_EIO;
    got += (size_t)n;
  }
  return 0;
}

/* Token `t` as the file's text (43 base64url characters and a newline) in a new file at `path` (0600,
 * O_EXCL), synced. 0, AH_EEXIST (the file exists) or AH_EIO (and nothing is left at `path`). */
static int write_token(const char *path, const uint8_t t[BF_TOKEN_BYTES]) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return errno == EEXIST ? AH_EEXIST : AH_EIO;
  char text[BF_TOKEN_CHARS + 2];
  bf_token_encode(t, text);
  text[BF_TOKEN_CHARS] = '\n';
  bool ok = write(fd, text, BF_TOKEN_CHARS + 1) == BF_TOKEN_CHARS + 1 && fsync(fd) == 0;
  close(fd);
  explicit_bzero(text, sizeof text);
  if (!ok) {
    unlink(path);
    return AH_EIO;
  }
  return 0;
}

static int create_token(bp_state *st, const char *path) {
  uint8_t t[BF_TOKEN_BYTES];
  if (random_bytes(t) != 0) {
    st->api->log(st->m, AH_PLOG_ERROR, "getrandom: %s", strerror(errno));
    return AH_EIO;
  }
  int rc = write_token(path, t);
  if (rc == AH_EIO)
    st->api->log(st->m, AH_PLOG_ERROR, "token file %s: cannot write it", path);
  if (rc == 0) {
    memcpy(st->token, t, sizeof t);
    st->api->log(st->m, AH_PLOG_INFO, "created a new token in %s", path);
  }
  explicit_bzero(t, sizeof t);
  return rc;
}

int bp_token_load(bp_state *st, const json_t *config) {
  const char *given = json_string_value(json_object_get(config, "token_file"));
  const char *sd = st->api->state_dir(st->m);
  char path[4096];
  if (bp_token_file_path(config, sd, path, sizeof path) != 0)
    return AH_ECONFIG;
  if (!(given && *given))
    mkdir(sd, 0700);
  st->token_path = strdup(path);
  if (!st->token_path)
    return AH_ENOMEM;
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      int rc = read_token(st, path, fd);
      close(fd);
      return rc;
    }
    if (errno != ENOENT) {
      st->api->log(st->m, AH_PLOG_ERROR, "token file %s: %s", path, strerror(errno));
      return AH_EIO;
    }
    int rc = create_token(st, path);
    if (rc != AH_EEXIST) /* another process created it meanwhile: read that one */
      return rc;
  }
  return AH_EIO;
}

int bp_token_file_path(const json_t *config, const char *state_dir, char *path, size_t cap) {
  const char *given = json_string_value(json_object_get(config, "token_file"));
  int n = given && *given ? snprintf(path, cap, "%s", given)
          : state_dir     ? snprintf(path, cap, "%s/token", state_dir)
                          : -1;
  return n < 0 || (size_t)n >= cap ? AH_ECONFIG : 0;
}

/* A new token in a temporary file (0600, O_EXCL) renamed over the old one, so a reader never sees a
 * partial file; the old token stops working at once. */
int bp_token_file_replace(const char *path, uint8_t out[BF_TOKEN_BYTES]) {
  uint8_t t[BF_TOKEN_BYTES];
  if (random_bytes(t) != 0)
    return AH_EIO;
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.new", path) >= (int)sizeof tmp)
    return AH_ECONFIG;
  unlink(tmp);
  if (write_token(tmp, t) != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    explicit_bzero(t, sizeof t);
    return AH_EIO;
  }
  if (out)
    memcpy(out, t, sizeof t);
  explicit_bzero(t, sizeof t);
  return 0;
}

/* `agenthost token rotate` with a daemon (browser.rotate-token). */
int bp_token_rotate(bp_state *st) {
  if (!st->token_path)
    return AH_EIO;
  uint8_t t[BF_TOKEN_BYTES];
  int rc = bp_token_file_replace(st->token_path, t);
  if (rc) {
    st->api->log(st->m, AH_PLOG_ERROR, "token file %s: cannot replace it", st->token_path);
    return rc;
  }
  memcpy(st->token, t, sizeof t);
  explicit_bzero(t, sizeof t);
  st->api->log(st->m, AH_PLOG_INFO, "the token was rotated (%s)", st->token_path);
  return 0;
}

void bp_base_url(const bp_state *st, char *url, size_t cap) {
  const char *host = st->listen_addr[0];
  bool v6 = strchr(host, ':') != NULL;
  bool wildcard = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
  snprintf(url, cap, "http://%s%s%s:%d/", v6 && !wildcard ? "[" : "", wildcard ? "127.0.0.1" : host,
           v6 && !wildcard ? "]" : "", st->ports[0]);
}

int bp_discovery_write(bp_state *st) {
  const char *rd = st->api->runtime_dir(st->m);
  if (!rd || st->nports == 0)
    return 0;
  char path[4096];
  if (snprintf(path, sizeof path, "%s/serve.json", rd) >= (int)sizeof path)
    return AH_ECONFIG;
  /* The host holds the runtime directory's lock (one daemon per directory): a file left here is stale. */
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    st->api->log(st->m, AH_PLOG_WARN, "cannot write %s: %s", path, strerror(errno));
    return AH_EIO;
  }
  char url[256];
  bp_base_url(st, url, sizeof url);
  json_t *j = json_pack("{s:s, s:i, s:I}", "url", url, "port", st->ports[0], "pid", (json_int_t)getpid());
  char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  bool ok = text && write(fd, text, strlen(text)) == (ssize_t)strlen(text) && write(fd, "\n", 1) == 1;
  free(text);
  close(fd);
  if (!ok) {
    unlink(path);
    return AH_EIO;
  }
  st->serve_json = strdup(path);
  return 0;
}

void bp_discovery_remove(bp_state *st) {
  if (!st->serve_json)
    return;
  /* Only our own file: a later daemon may have replaced it. */
  char buf[512];
  int fd = open(st->serve_json, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    json_t *j = n > 0 ? json_loadb(buf, (size_t)n, 0, NULL) : NULL;
    if (j && json_integer_value(json_object_get(j, "pid")) == (json_int_t)getpid())
      unlink(st->serve_json);
    json_decref(j);
  }
  free(st->serve_json);
  st->serve_json = NULL;
}
