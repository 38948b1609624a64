/* API-TRUST-FENCE: the browser's request fence (plugins/browser/fence.c): every request — its method, path,
 * headers and peer taken from the input's lines — gets a decision, admitted only with the token, from
 * loopback for a privileged method, and never with a path holding a NUL; a static path maps to a file inside
 * the UI's directory; host names and tokens decode within bounds. */
#include <arpa/inet.h>
#include <netinet/in.h>

#include "../../plugins/browser/fence.h"
#include "fuzz_support.h"

static const uint8_t token[BF_TOKEN_BYTES] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                              17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static bf_method_class classify(const char *method, void *arg) {
  (void)arg;
  if (strcmp(method, "session.list") == 0 || strcmp(method, "session.prompt") == 0)
    return BF_METHOD_PUBLIC;
  if (strcmp(method, "plugin.load") == 0)
    return BF_METHOD_PRIVILEGED;
  return BF_METHOD_UNKNOWN;
}

static const char *opt(char *s) {
  return s && strcmp(s, "-") == 0 ? NULL : s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *f[16] = {0};
  char *buf = NULL;
  size_t n = fuzz_fields(data, size, '\n', f, 16, &buf);
  if (n == 0)
    return 0;
  /* The first field's bytes choose the peer and the flags; the path is field 2 with its length kept (a
   * NUL inside it comes from a "%00" decoded upstream: here the byte 0x01 stands for one). */
  uint8_t flags = (uint8_t)f[0][0];
  struct sockaddr_in v4 = {.sin_family = AF_INET};
  struct sockaddr_in6 v6 = {.sin6_family = AF_INET6};
  inet_pton(AF_INET, flags & 1 ? "127.0.0.1" : "192.0.2.7", &v4.sin_addr);
  inet_pton(AF_INET6, flags & 1 ? "::1" : "2001:db8::1", &v6.sin6_addr);
  const struct sockaddr *peer = flags & 2 ? (const struct sockaddr *)&v6 : (const struct sockaddr *)&v4;
  char *path = n > 2 ? f[2] : "/";
  size_t path_len = strlen(path);
  for (size_t i = 0; i < path_len; i++)
    if (path[i] == 1)
      path[i] = '\0';
  bf_request req = {.method = n > 1 ? f[1] : "GET",
                    .path = path,
                    .path_len = path_len,
                    .upgrade = flags & 4,
                    .upgrade_other = n > 3 ? opt(f[3]) : NULL,
                    .host = n > 4 ? opt(f[4]) : NULL,
                    .host_count = (flags >> 3) & 3,
                    .origin = n > 5 ? opt(f[5]) : NULL,
                    .sec_fetch_site = n > 6 ? opt(f[6]) : NULL,
                    .sec_fetch_mode = n > 7 ? opt(f[7]) : NULL,
                    .authorization = n > 8 ? opt(f[8]) : NULL,
                    .ws_protocol = n > 9 ? opt(f[9]) : NULL,
                    .content_type = n > 10 ? opt(f[10]) : NULL,
                    .content_length = n > 11 ? opt(f[11]) : NULL,
                    .transfer_encoding = n > 12 ? opt(f[12]) : NULL,
                    .peer = peer,
                    .oversized = flags & 32 ? "Origin" : NULL};
  const char *hosts[] = {"agenthost.example"};
  const char *origins[] = {"http://agenthost.example:7878"};
  const int ports[] = {7878};
  bf_policy pol = {.token = token,
                   .hosts = hosts,
                   .nhosts = 1,
                   .origins = origins,
                   .norigins = 1,
                   .ports = ports,
                   .nports = 1,
                   .any_ip_literal = flags & 64,
                   .max_body = 1 << 20,
                   .max_body_prompt = 160u << 20,
                   .classify = classify};
  bf_decision d;
  memset(&d, 0xa5, sizeof d);
  bf_decide(&pol, &req, &d);
  FUZZ_CHECK(d.status == 0 || (d.status >= 400 && d.status <= 599));
  FUZZ_CHECK(d.reason == NULL || strlen(d.reason) < 200);
  if (d.status == 0) {
    FUZZ_CHECK(memchr(req.path, '\0', req.path_len) == NULL);
    FUZZ_CHECK(req.host && req.host_count == 1);
    FUZZ_CHECK(req.oversized == NULL);
    if (d.route == BF_ROUTE_API) {
      FUZZ_CHECK(memchr(d.method, '\0', sizeof d.method));
      FUZZ_CHECK(d.authenticated);
      if (classify(d.method, NULL) != BF_METHOD_PUBLIC)
        FUZZ_CHECK(d.loopback);
    }
    if (d.route == BF_ROUTE_EXPORT)
      FUZZ_CHECK(memchr(d.session_id, '\0', sizeof d.session_id));
  }
  /* The static route's file: never above the UI's directory, never a dotfile, never absolute. */
  char rel[512];
  if (req.path_len && req.path[0] == '/' && memchr(req.path, '\0', req.path_len) == NULL &&
      bf_static_path(req.path, rel, sizeof rel)) {
    FUZZ_CHECK(rel[0] != '/' && rel[0] != '.' && strstr(rel, "/.") == NULL && strstr(rel, "//") == NULL);
    FUZZ_CHECK(strlen(rel) < sizeof rel);
  }
  /* The mux cursor: accepted exactly when it is digits that fit, and then it prints back the same. */
  const char *cur = n > 13 ? f[13] : "";
  int64_t after = -1;
  bool digits = cur[0] != '\0' && strspn(cur, "0123456789") == strlen(cur);
  if (bf_mux_cursor(cur, &after)) {
    char back[32];
    snprintf(back, sizeof back, "%lld", (long long)after);
    FUZZ_CHECK(digits && after >= 0);
    const char *z = cur;
    while (*z == '0' && z[1])
      z++;
    FUZZ_CHECK(strcmp(back, z) == 0);
  } else {
    FUZZ_CHECK(!digits || strlen(cur) >= 19);
  }
  char name[256];
  if (bf_host_name(n > 4 ? f[4] : "", name, sizeof name))
    FUZZ_CHECK(memchr(name, '\0', sizeof name));
  uint8_t out[BF_TOKEN_BYTES];
  const char *t = n > 8 ? f[8] : "";
  if (bf_token_decode(t, strlen(t), out)) {
    char again[BF_TOKEN_CHARS + 1];
    bf_token_encode(out, again);
    FUZZ_CHECK(strlen(t) == BF_TOKEN_CHARS);
  }
  free(buf);
  return 0;
}
