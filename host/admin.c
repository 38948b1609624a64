/* The admin channel: a 0600 Unix socket in a 0700 runtime directory. Only the user who runs the daemon
 * can connect, so its callers get admin authority; the core still applies the method flags. */
#include "admin.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"

static void set_why(char **why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_why(char **why, const char *fmt, ...) {
  if (!why)
    return;
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(why, fmt, ap) < 0)
    *why = NULL;
  va_end(ap);
}

int ah__runtime_dir_prepare(const char *dir, char **why) {
  if (!dir || dir[0] != '/') {
    set_why(why, "runtime_dir must be an absolute path");
    return AH_EINVAL;
  }
  const char *failed = NULL;
  int e = ah__mkdirs(dir, &failed);
  if (e) {
    set_why(why, "cannot create %s: %s", failed, strerror(-e));
    return AH_EIO;
  }
  struct stat st;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    set_why(why, "%s is not a directory (symlinks are refused)", dir);
    return AH_EPERM;
  }
  if (st.st_uid != geteuid()) {
    set_why(why, "%s belongs to uid %u, not to us", dir, (unsigned)st.st_uid);
    return AH_EPERM;
  }
  if ((st.st_mode & 077) != 0 && chmod(dir, 0700) != 0) {
    set_why(why, "cannot make %s private: %s", dir, strerror(errno));
    return AH_EPERM;
  }
  return 0;
}

int ah__runtime_lock(const char *dir, char **why) {
  char path[4096];
  snprintf(path, sizeof path, "%s/serve.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    set_why(why, "cannot open %s: %s", path, strerror(errno));
    return AH_EIO;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    set_why(why, "agenthost serve is already running for %s (pid %ld)", dir, strtol(buf, NULL, 10));
    return AH_EBUSY;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    set_why(why, "cannot write %s: %s", path, strerror(errno));
    close(fd);
    return AH_EIO;
  }
  return fd;
}

int ah__runtime_stop(const char *dir, uint64_t timeout_ms, long *pid, char **why) {
  *pid = 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/serve.lock", dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    set_why(why, "no agenthost serve runs for %s", dir);
    return AH_ENOENT;
  }
  if (fd < 0) {
    set_why(why, "cannot open %s: %s", path, strerror(errno));
    return AH_EIO;
  }
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) { /* nobody holds it: no daemon */
    close(fd);
    set_why(why, "no agenthost serve runs for %s", dir);
    return AH_ENOENT;
  }
  /* Held: by the daemon, which wrote its pid after taking it (and the fd is close-on-exec). */
  char buf[32] = "";
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  buf[n > 0 ? n : 0] = '\0';
  *pid = strtol(buf, NULL, 10);
  if (*pid <= 1 || kill((pid_t)*pid, SIGTERM) != 0) {
    set_why(why, "cannot signal the daemon (pid %ld in %s): %s", *pid, path,
            *pid <= 1 ? "no pid" : strerror(errno));
    close(fd);
    return AH_EIO;
  }
  /* Stopped when the lock is free: the daemon releases it as it exits, after its orderly stop. */
  uint64_t start = uv_hrtime();
  int rc = AH_ETIMEDOUT;
  while (timeout_ms == 0 || (uv_hrtime() - start) / 1000000 < timeout_ms) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
      rc = 0;
      break;
    }
    usleep(20 * 1000);
  }
  close(fd);
  if (rc)
    set_why(why, "the daemon (pid %ld) is still stopping after %llu ms", *pid,
            (unsigned long long)timeout_ms);
  return rc;
}

/* ---- server ---------------------------------------------------------------------------------------- */

typedef struct conn conn;

struct ah_admin {
  ah_host *host;
  uv_pipe_t server;
  char *path;
  ah__link conns;
  uint64_t next_id;
  int open_handles;
  bool stopping;
  void (*stop_cb)(void *arg);
  void *stop_arg;
};

struct conn {
  ah_admin *admin;
  uv_pipe_t pipe;
  ah_rpc_peer *peer;
  ah_cancel *token;
  uint64_t id;
  bool closing;
  ah__link link;
};

static void admin_handle_closed(ah_admin *a) {
  if (--a->open_handles > 0)
    return;
  void (*cb)(void *) = a->stop_cb;
  void *arg = a->stop_arg;
  free(a->path);
  free(a);
  if (cb)
    cb(arg);
}

static void conn_pipe_closed(uv_handle_t *h) {
  conn *c = h->data;
  ah_admin *a = c->admin;
  ah__list_remove(&c->link);
  ah__cancel_free(c->token);
  free(c);
  admin_handle_closed(a);
}

static void conn_peer_closed(ah_rpc_peer *p, void *arg) {
  (void)p;
  conn *c = arg;
  uv_close((uv_handle_t *)&c->pipe, conn_pipe_closed);
}

static void conn_close(conn *c) {
  if (c->closing)
    return;
  c->closing = true;
  /* Trip first: every call of this connection is answered `cancelled` and its watch on our token fires,
   * so no call keeps a pointer into the token we free with the connection. */
  ah__cancel_trip(c->token);
  if (ah_rpc_close(c->peer, conn_peer_closed, c) != 0)
    uv_close((uv_handle_t *)&c->pipe, conn_pipe_closed);
}

static void reply_cb(const ah_outcome *o, void *arg) {
  ah_rpc_inbound *req = arg;
  if (o->status == 0) {
    ah_rpc_respond(req, json_deep_copy(o->result));
    return;
  }
  json_t *data =
      json_pack("{s:s, s:s}", "category", ah_err_category(o->status), "name", ah_err_name(o->status));
  if (o->data)
    json_object_set(data, "detail", (json_t *)o->data);
  ah_rpc_respond_error(req, ah_err_rpc_code(o->status), o->message, data);
}

static void on_request(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  (void)peer;
  conn *c = data;
  ah_caller caller = {
      .struct_size = sizeof caller, .authority = AH_AUTH_ADMIN, .surface = "admin", .connection_id = c->id};
  json_t *p = params ? json_deep_copy(params) : NULL;
  int rc = ah__host_dispatch(c->admin->host, &caller, method, p, c->token, reply_cb, req);
  if (rc) {
    ah_outcome o = {.status = rc, .result = NULL, .message = ah_strerror(rc), .data = NULL};
    reply_cb(&o, req);
  }
}

static void on_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  (void)status;
  conn_close(data);
}

static void on_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  conn *c = data;
  AH_LOG_W("admin", "connection %llu: %s", (unsigned long long)c->id, msg);
}

static void on_connection(uv_stream_t *server, int status) {
  ah_admin *a = server->data;
  if (status < 0 || a->stopping)
    return;
  conn *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->admin = a;
  c->id = ++a->next_id;
  c->token = ah__cancel_new(NULL);
  uv_pipe_init(server->loop, &c->pipe, 0);
  c->pipe.data = c;
  ah__list_init(&c->link);
  a->open_handles++;
  ah__list_push(&a->conns, &c->link);
  ah_rpc_opts opts = {.struct_size = sizeof opts,
                      .max_line = 16 * 1024 * 1024,
                      .on_request = on_request,
                      .on_eof = on_eof,
                      .on_log = on_log,
                      .data = c};
  if (!c->token || uv_accept(server, (uv_stream_t *)&c->pipe) != 0 ||
      ah_rpc_open((uv_stream_t *)&c->pipe, (uv_stream_t *)&c->pipe, &opts, &c->peer) != 0) {
    c->closing = true;
    uv_close((uv_handle_t *)&c->pipe, conn_pipe_closed);
  }
}

static void server_closed(uv_handle_t *h) {
  admin_handle_closed(h->data);
}

int ah__admin_start(ah_host *h, const char *runtime_dir, ah_admin **out, char **why) {
  ah_admin *a = calloc(1, sizeof *a);
  if (!a)
    return AH_ENOMEM;
  a->host = h;
  ah__list_init(&a->conns);
  if (asprintf(&a->path, "%s/admin.sock", runtime_dir) < 0) {
    free(a);
    return AH_ENOMEM;
  }
  if (strlen(a->path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    set_why(why, "%s is too long for a Unix socket path", a->path);
    free(a->path);
    free(a);
    return AH_E2BIG;
  }
  /* We hold the runtime lock, so a socket file left here belongs to a daemon that died. */
  unlink(a->path);
  uv_pipe_init(h->loop, &a->server, 0);
  a->server.data = a;
  a->open_handles = 1;
  mode_t old = umask(0177);
  int rc = uv_pipe_bind(&a->server, a->path);
  umask(old);
  if (rc == 0)
    rc = chmod(a->path, 0600) == 0 ? 0 : uv_translate_sys_error(errno);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&a->server, 64, on_connection);
  if (rc) {
    set_why(why, "cannot listen on %s: %s", a->path, uv_strerror(rc));
    a->stop_cb = NULL;
    uv_close((uv_handle_t *)&a->server, server_closed);
    return AH_EIO;
  }
  AH_LOG_I("admin", "listening on %s", a->path);
  *out = a;
  return 0;
}

void ah__admin_stop(ah_admin *a, void (*cb)(void *arg), void *arg) {
  if (!a) {
    if (cb)
      cb(arg);
    return;
  }
  a->stopping = true;
  a->stop_cb = cb;
  a->stop_arg = arg;
  unlink(a->path);
  AH__LIST_EACH(it, &a->conns) {
    conn_close(AH__CONTAINER(it, conn, link));
  }
  uv_close((uv_handle_t *)&a->server, server_closed);
}

/* ---- client ---------------------------------------------------------------------------------------- */

typedef struct client {
  uv_pipe_t pipe;
  uv_connect_t connect;
  uv_timer_t timer;
  ah_rpc_peer *peer;
  const char *method;
  json_t *params;
  int status;
  bool done;
  bool peer_closed;
  json_t *result;
  json_t *error;
} client;

static void client_peer_closed(ah_rpc_peer *p, void *arg) {
  (void)p;
  ((client *)arg)->peer_closed = true;
}

static void client_finish(client *c, int status) {
  if (c->done)
    return;
  c->done = true;
  c->status = status;
  uv_timer_stop(&c->timer);
  if (!c->peer || ah_rpc_close(c->peer, client_peer_closed, c) != 0)
    c->peer_closed = true;
}

static void client_response(ah_rpc_peer *p, int status, const json_t *result, const json_t *error,
                            void *arg) {
  (void)p;
  client *c = arg;
  if (status == 0)
    c->result = json_deep_copy(result);
  else if (error)
    c->error = json_deep_copy(error);
  client_finish(c, status);
}

static void client_eof(ah_rpc_peer *p, int status, void *data) {
  (void)p;
  (void)status;
  client_finish(data, AH_ECLOSED);
}

static void client_connected(uv_connect_t *req, int status) {
  client *c = req->data;
  if (status < 0) {
    client_finish(c, AH_ECLOSED);
    return;
  }
  ah_rpc_opts opts = {.struct_size = sizeof opts, .on_eof = client_eof, .data = c};
  if (ah_rpc_open((uv_stream_t *)&c->pipe, (uv_stream_t *)&c->pipe, &opts, &c->peer) != 0) {
    client_finish(c, AH_EIO);
    return;
  }
  json_t *params = c->params;
  c->params = NULL;
  if (ah_rpc_request(c->peer, c->method, params, client_response, c, NULL) != 0)
    client_finish(c, AH_ECLOSED);
}

static void client_timeout(uv_timer_t *t) {
  client_finish(t->data, AH_ETIMEDOUT);
}

/* The AH_E* code of an error answer: its data.name ("ENOENT", …, what every surface sends), else
 * AH_EPROTO. */
static int code_of_error(const json_t *error) {
  const char *name = json_string_value(json_object_get(json_object_get(error, "data"), "name"));
#define AH__ERR_BY_NAME(n, value, category, message) \
  if (name && strcmp(name, #n) == 0)                 \
    return value;
  AH_ERRNO_MAP(AH__ERR_BY_NAME)
#undef AH__ERR_BY_NAME
  return AH_EPROTO;
}

int ah__admin_call(const char *runtime_dir, const char *method, json_t *params, uint64_t timeout_ms,
                   json_t **result, json_t **error) {
  *result = NULL;
  if (error)
    *error = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/admin.sock", runtime_dir);
  uv_loop_t loop;
  uv_loop_init(&loop);
  client c;
  memset(&c, 0, sizeof c);
  c.method = method;
  c.params = params;
  uv_pipe_init(&loop, &c.pipe, 0);
  uv_timer_init(&loop, &c.timer);
  c.timer.data = &c;
  c.connect.data = &c;
  uv_timer_start(&c.timer, client_timeout, timeout_ms, 0);
  uv_pipe_connect(&c.connect, &c.pipe, path, client_connected);
  while (!c.done && uv_run(&loop, UV_RUN_ONCE))
    ;
  /* Let the peer flush and close, then close our handles (the streams are ours after its callback). */
  while (c.done && !c.peer_closed && uv_run(&loop, UV_RUN_ONCE))
    ;
  uv_close((uv_handle_t *)&c.pipe, NULL);
  uv_close((uv_handle_t *)&c.timer, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  json_decref(c.params);
  if (c.status == 0 && c.result) {
    *result = c.result;
    return 0;
  }
  json_decref(c.result);
  int status = c.status ? c.status : AH_EPROTO;
  if (c.error)
    status = code_of_error(c.error);
  if (error)
    *error = c.error;
  else
    json_decref(c.error);
  return status;
}
