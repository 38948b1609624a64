/* agenthost browser plugin — the static UI and the session export (PROTOCOLS.md "export", "UI"; SECURITY.md
 * T8).
 *
 * The UI directory is `ui_dir` from the configuration, else the directory compiled in: the source tree's
 * plugins/browser/ui when the module runs from the build tree, the installed data directory otherwise. It is
 * opened once at mount; every file is opened beneath it with openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_MAGICLINKS), so neither ".." nor a symlink can leave it. Segments that start with '.' (dotfiles,
 * "..") and empty segments are refused before that (404), as is anything that is not a regular file.
 * Responses carry a strong ETag (size, mtime, inode); If-None-Match with it answers 304.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "browser.h"

#define STATIC_MAX (16u << 20)

static bool module_in_build_tree(void) {
#ifdef BP_BUILD_DIR
  Dl_info info;
  if (!dladdr((void *)module_in_build_tree, &info) || !info.dli_fname)
    return false;
  size_t n = strlen(BP_BUILD_DIR);
  return strncmp(info.dli_fname, BP_BUILD_DIR, n) == 0 && info.dli_fname[n] == '/';
#else
  return false;
#endif
}

int bp_ui_open(bp_state *st, const json_t *config) {
  const char *mk = json_string_value(json_object_get(config, "marked_js"));
  const char *dp = json_string_value(json_object_get(config, "dompurify_js"));
  const char *cj = json_string_value(json_object_get(config, "chartjs_js"));
  st->marked_js = strdup(mk && *mk ? mk : "/usr/share/javascript/marked/marked.min.js");
  st->dompurify_js = strdup(dp && *dp ? dp : "/usr/share/nodejs/dompurify/dist/purify.min.js");
  st->chartjs_js = strdup(cj && *cj ? cj : "/usr/share/javascript/chart.js/chart.min.js");
  const char *dir = json_string_value(json_object_get(config, "ui_dir"));
  if (!dir || !*dir) {
#if defined(BP_SOURCE_UI_DIR) && defined(BP_INSTALL_UI_DIR)
    dir = module_in_build_tree() ? BP_SOURCE_UI_DIR : BP_INSTALL_UI_DIR;
#else
    dir = NULL;
#endif
  }
  if (!dir)
    return 0;
  st->ui_dir = strdup(dir);
  st->ui_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (st->ui_fd < 0)
    st->api->log(st->m, AH_PLOG_WARN, "no web UI: cannot open %s: %s", dir, strerror(errno));
  return 0;
}

static const char *mime_of(const char *path) {
  static const struct {
    const char *ext;
    const char *type;
  } types[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".json", "application/json"},
      {".map", "application/json"},
      {".webmanifest", "application/manifest+json"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".ico", "image/x-icon"},
      {".woff2", "font/woff2"},
      {".txt", "text/plain; charset=utf-8"},
  };
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  if (dot && (!slash || dot > slash))
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
      if (strcasecmp(dot, types[i].ext) == 0)
        return types[i].type;
  return "application/octet-stream";
}

static int open_beneath(int dirfd, const char *rel) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
  if (fd < 0 && errno == ENOSYS) {
    /* Without openat2: no symlink at all (stricter than RESOLVE_BENEATH). */
    errno = 0;
    return -1;
  }
  return (int)fd;
}

static int not_found(bp_state *st, bp_http *h, struct lws *wsi, const char *path) {
  (void)path;
  static const char body[] = "not found\n";
  if (bp_build_response(wsi, &h->out, 404, "text/plain; charset=utf-8", NULL, body, sizeof body - 1, false,
                        false) != 0)
    return -1;
  (void)st;
  bp_send_later(h, wsi);
  return 0;
}

/* The UI's libraries come from the system's packages, not from the UI directory: marked (Debian:
 * libjs-marked) and DOMPurify (node-dompurify), at /vendor/marked.min.js and /vendor/purify.min.js, and
 * Chart.js (libjs-chart.js) at /vendor/chart.min.js. [plugin.browser] marked_js, dompurify_js and chartjs_js
 * name other files. Without the first two the UI shows model output as plain text, without Chart.js the
 * usage panel shows its table alone. */
static int open_vendor(bp_state *st, const char *rel) {
  const struct {
    const char *rel;
    const char *path;
  } vendor[] = {{"vendor/marked.min.js", st->marked_js},
                {"vendor/purify.min.js", st->dompurify_js},
                {"vendor/chart.min.js", st->chartjs_js}};
  for (size_t i = 0; i < sizeof vendor / sizeof vendor[0]; i++)
    if (strcmp(rel, vendor[i].rel) == 0)
      return vendor[i].path ? open(vendor[i].path, O_RDONLY | O_CLOEXEC) : -1;
  return -2;
}

int bp_static_serve(bp_state *st, bp_http *h, struct lws *wsi, const char *path) {
  char rel[4096];
  if (!bf_static_path(path, rel, sizeof rel))
    return not_found(st, h, wsi, path);
  int fd = open_vendor(st, rel);
  if (fd == -2) {
    if (st->ui_fd < 0)
      return not_found(st, h, wsi, path);
    fd = open_beneath(st->ui_fd, rel);
  }
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > STATIC_MAX) {
    if (fd >= 0)
      close(fd);
    return not_found(st, h, wsi, path);
  }
  char etag[96];
  snprintf(etag, sizeof etag, "\"%llx-%llx-%llx\"", (unsigned long long)sb.st_size,
           (unsigned long long)sb.st_mtim.tv_sec * 1000000000ull + (unsigned long long)sb.st_mtim.tv_nsec,
           (unsigned long long)sb.st_ino);
  char extra[160];
  snprintf(extra, sizeof extra, "etag:%s\n", etag);
  char inm[128];
  if (lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_IF_NONE_MATCH) > 0 &&
      lws_hdr_copy(wsi, inm, sizeof inm, WSI_TOKEN_HTTP_IF_NONE_MATCH) > 0 && strstr(inm, etag)) {
    close(fd);
    if (bp_build_response(wsi, &h->out, 304, NULL, extra, NULL, 0, false, false) != 0)
      return -1;
    bp_send_later(h, wsi);
    return 0;
  }
  size_t size = (size_t)sb.st_size;
  char *buf = malloc(size ? size : 1);
  size_t got = 0;
  while (buf && got < size) {
    ssize_t n = read(fd, buf + got, size - got);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  int rc = -1;
  if (buf && got == size)
    rc = bp_build_response(wsi, &h->out, 200, mime_of(rel), extra, buf, size, false, false);
  free(buf);
  if (rc != 0)
    return -1;
  bp_send_later(h, wsi);
  return 0;
}

/* ---- export ----------------------------------------------------------------------------------------------
 */

static void on_export(const ah_outcome *o, void *arg) {
  bp_req *r = arg;
  r->dispatched = false;
  r->st->outstanding--;
  if (r->wsi && r->http) {
    const char *jsonl = o->status == 0 ? json_string_value(json_object_get(o->result, "jsonl")) : NULL;
    size_t len = jsonl ? json_string_length(json_object_get(o->result, "jsonl")) : 0;
    int rc = 0;
    if (jsonl) {
      char extra[256];
      snprintf(extra, sizeof extra, "content-disposition:attachment; filename=\"%s.jsonl\"\n", r->session_id);
      rc = bp_build_response(r->wsi, &r->http->out, 200, "application/x-ndjson", extra, jsonl, len, true,
                             false);
    } else {
      int status = o->status == AH_ENOENT ? 404 : o->status == AH_EPERM ? 403 : 500;
      json_t *body = json_pack("{s:s, s:{s:s, s:s}}", "kind", "server-response", "error", "code",
                               status == 404   ? "not-found"
                               : status == 403 ? "forbidden"
                                               : "internal",
                               "message",
                               status == 404   ? "no such session"
                               : status == 403 ? "forbidden"
                                               : "internal error");
      char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
      json_decref(body);
      if (status == 500)
        r->st->api->log(r->st->m, AH_PLOG_ERROR, "export of %s failed: %s", r->session_id,
                        o->message ? o->message : "?");
      rc = bp_build_response(r->wsi, &r->http->out, status, "application/json", NULL, text ? text : "{}",
                             text ? strlen(text) : 2, true, false);
      free(text);
    }
    if (rc == 0)
      bp_send_later(r->http, r->wsi);
  }
  bp_req_release(r);
}

int bp_export_begin(bp_state *st, bp_http *h, struct lws *wsi, const bf_decision *d) {
  bp_req *r = bp_req_new(st, h, wsi, BP_REQ_EXPORT);
  if (!r)
    return -1;
  r->loopback = d->loopback;
  snprintf(r->method, sizeof r->method, "session.export");
  snprintf(r->session_id, sizeof r->session_id, "%s", d->session_id);
  ah_caller c;
  int rc = st->api->token_new(st->m, NULL, &r->token);
  if (rc == 0)
    rc = st->api->dispatch(st->m, bp_caller(&c, d->loopback, h->conn_id), "session.export",
                           json_pack("{s:s}", "sessionId", d->session_id), r->token, on_export, r);
  if (rc) {
    bp_req_release(r);
    bp_refuse_now(st, wsi, 503, "export unavailable", NULL, false, false);
    return lws_http_transaction_completed(wsi) ? -1 : 0;
  }
  r->dispatched = true;
  st->outstanding++;
  bp_hold_input(h, wsi);
  return 0;
}
