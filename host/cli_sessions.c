/* agenthost — `agenthost sessions list|show|export`: the store read directly, read-only, without a daemon;
 * `sessions delete` (through the daemon when one runs); and the escaping every command line output of
 * stored text goes through. */
#include "cli_sessions.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin.h"
#include "agenthost/errors.h"
#include "internal.h"
#include "log.h"
#include "store.h"

/* ---- sessions: read the store directly, read-only ------------------------------------------------------
 *
 * The database is opened read-only on a private loop: nothing is created, migrated or written, no daemon is
 * needed, and no session is resumed (a running daemon is not disturbed: WAL lets readers run beside its
 * writer). `sessions delete` without a daemon opens the same way, read-write. */

typedef struct cli_store {
  uv_loop_t loop;
  ah_store *store;
  char path[4096];
  bool had_wal; /* path-wal and path-shm existed before the open */
  bool had_shm;
} cli_store;

static bool exists_with(const char *path, const char *suffix) {
  char p[4200];
  snprintf(p, sizeof p, "%s%s", path, suffix);
  return access(p, F_OK) == 0;
}

/* Reading a WAL database needs its -wal and -shm files. A read-only SQLite connection creates them when they
 * are missing (after a clean stop) but, unable to lock the database for writing, cannot remove them when it
 * closes, as the last connection normally does. So that a reader leaves the state directory as it found it,
 * the files it made are removed after the store is closed, under the test SQLite itself makes first: an
 * exclusive lock on the database's SHARED byte range (every open connection holds a shared lock there, and a
 * connection being opened waits while it is held; SQLite's unix VFS: PENDING_BYTE 0x40000000, SHARED_FIRST
 * = PENDING_BYTE + 2, SHARED_SIZE 510), and only while the WAL is still empty. Nothing is written. */
static void remove_made_wal(const cli_store *r) {
  if (r->had_wal)
    return;
  char wal[4200];
  char shm[4200];
  snprintf(wal, sizeof wal, "%s-wal", r->path);
  snprintf(shm, sizeof shm, "%s-shm", r->path);
  int fd = open(r->path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return;
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0x40000000 + 2, .l_len = 510};
  if (fcntl(fd, F_SETLK, &lk) == 0) {
    struct stat st;
    if (stat(wal, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) {
      unlink(wal);
      if (!r->had_shm)
        unlink(shm);
    }
    lk.l_type = F_UNLCK;
    fcntl(fd, F_SETLK, &lk);
  }
  close(fd);
}

static int store_open(const ah_config *cfg, const char *what, cli_store *r, bool read_only) {
  ah_store_opts opts = {.sync = AH_STORE_SYNC_NORMAL, .read_only = read_only};
  const ah_store_backend *backend = NULL;
  char *password = NULL;
  char *why = NULL;
  int rc = ah__config_store(cfg, &opts, &backend, r->path, sizeof r->path, &password, &why);
  if (rc) {
    fprintf(stderr, "agenthost: %s: %s\n", what, why ? why : ah_strerror(rc));
    free(why);
    return rc;
  }
  /* A writer leaves the -wal and -shm files to SQLite (remove_made_wal is for readers only). */
  r->had_wal = !opts.path || !read_only || exists_with(r->path, "-wal");
  r->had_shm = !opts.path || !read_only || exists_with(r->path, "-shm");
  uv_loop_init(&r->loop);
  rc = ah__store_open(&r->loop, backend, &opts, &r->store, &why);
  ah__wipe_free(password);
  if (rc) {
    fprintf(stderr, "agenthost: %s: %s\n", what, why ? why : ah_strerror(rc));
    free(why);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    uv_loop_close(&r->loop);
    r->store = NULL;
    remove_made_wal(r);
  }
  return rc;
}

static void store_closed(void *arg) {
  *(bool *)arg = true;
}

static void store_close(cli_store *r) {
  bool closed = false;
  ah__store_close(r->store, store_closed, &closed);
  while (!closed && uv_run(&r->loop, UV_RUN_ONCE))
    ;
  uv_run(&r->loop, UV_RUN_DEFAULT);
  uv_loop_close(&r->loop);
  r->store = NULL;
  remove_made_wal(r);
}

/* `s` with every control character, backslash and invalid UTF-8 byte escaped (the log's rules), cut to at
 * most `max` characters (0 = no limit) with "..." when cut; malloc'ed, never NULL ("" on failure). */
char *ah__cli_esc(const char *s, size_t max) {
  if (!s)
    s = "";
  size_t n = strlen(s);
  size_t cap = n * 6 + 8;
  char *out = malloc(cap);
  if (!out)
    return strdup("");
  ah__log_escape(out, cap, s, n);
  if (max > 3) {
    /* The output is valid UTF-8: characters start at bytes that are not continuation bytes. */
    size_t chars = 0;
    size_t cut = 0; /* where the (max - 3)th character starts */
    for (size_t i = 0; out[i]; i++) {
      if (((unsigned char)out[i] & 0xc0) == 0x80)
        continue;
      if (chars == max - 3)
        cut = i;
      if (chars == max) {
        memcpy(out + cut, "...", 4);
        break;
      }
      chars++;
    }
  }
  return out;
}

const char *ah__cli_jstr(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

/* The row as the CLI shows it: without the lease internals, status "closed" for a closed session. */
static json_t *cli_row(const json_t *row) {
  json_t *r = json_deep_copy(row);
  json_object_del(r, "leaseOwner");
  json_object_del(r, "leaseUntil");
  if (json_is_true(json_object_get(r, "closed")))
    json_object_set_new(r, "status", json_string("closed"));
  return r;
}

static int print_json(json_t *v) {
  int rc = json_dumpf(v, stdout, JSON_INDENT(2));
  fputc('\n', stdout);
  return rc;
}

/* stdout was written completely (a closed pipe or a full disk is an error). */
static int flush_out(const char *what) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "agenthost: %s: cannot write the output\n", what);
    return 1;
  }
  return 0;
}

static int sessions_list(cli_store *r, bool as_json) {
  json_t *all = json_array();
  char *after = NULL;
  int code = 0;
  for (;;) {
    json_t *page = ah__store_list_sessions(r->store, after, 200);
    if (!page) {
      fprintf(stderr, "agenthost: sessions list: the store could not be read\n");
      code = 1;
      break;
    }
    size_t i = 0;
    json_t *row = NULL;
    json_array_foreach(page, i, row) {
      json_array_append_new(all, cli_row(row));
    }
    size_t n = json_array_size(page);
    free(after);
    after = n ? strdup(ah__cli_jstr(json_array_get(page, n - 1), "id")) : NULL;
    json_decref(page);
    if (n < 200 || !after)
      break;
  }
  free(after);
  if (code == 0) {
    if (as_json) {
      print_json(all);
    } else {
      printf("%-36s  %-8s  %-24s  %-30s  %s\n", "ID", "STATUS", "CREATED", "TITLE", "CWD");
      size_t i = 0;
      json_t *row = NULL;
      json_array_foreach(all, i, row) {
        char *id = ah__cli_esc(ah__cli_jstr(row, "id"), 0);
        char *status = ah__cli_esc(ah__cli_jstr(row, "status"), 0);
        char *created = ah__cli_esc(ah__cli_jstr(row, "created"), 0);
        char *title = ah__cli_esc(ah__cli_jstr(row, "title") ? ah__cli_jstr(row, "title") : "-", 30);
        char *cwd = ah__cli_esc(ah__cli_jstr(row, "cwd"), 0);
        printf("%-36s  %-8s  %-24s  %-30s  %s\n", id, status, created, title, cwd);
        free(id);
        free(status);
        free(created);
        free(title);
        free(cwd);
      }
    }
    code = flush_out("sessions list");
  }
  json_decref(all);
  return code;
}

/* Every event of session `id`, in seq order; NULL when the store could not be read. */
static json_t *all_events(cli_store *r, const char *id) {
  json_t *all = json_array();
  int64_t after = 0;
  for (;;) {
    json_t *page = ah__store_events(r->store, id, after, 1000);
    if (!page) {
      json_decref(all);
      return NULL;
    }
    size_t n = json_array_size(page);
    if (n)
      after = json_integer_value(json_object_get(json_array_get(page, n - 1), "seq"));
    json_array_extend(all, page);
    json_decref(page);
    if (n < 1000)
      return all;
  }
}

/* The text of a content array: its text blocks, resource links as <uri>. */
static char *content_text(const json_t *content) {
  size_t len = 0;
  char *buf = NULL;
  FILE *f = open_memstream(&buf, &len);
  if (!f)
    return strdup("");
  size_t i = 0;
  json_t *b = NULL;
  json_array_foreach(content, i, b) {
    const char *type = ah__cli_jstr(b, "type");
    if (i)
      fputc(' ', f);
    if (type && strcmp(type, "text") == 0 && ah__cli_jstr(b, "text"))
      fputs(ah__cli_jstr(b, "text"), f);
    else if (ah__cli_jstr(b, "uri"))
      fprintf(f, "<%s>", ah__cli_jstr(b, "uri"));
    else
      fprintf(f, "[%s]", type ? type : "block");
  }
  fclose(f);
  return buf ? buf : strdup("");
}

/* A short readable summary of an event's data (raw text; the caller escapes and cuts it). */
static char *event_summary(const json_t *ev) {
  const char *kind = ah__cli_jstr(ev, "kind");
  const json_t *d = json_object_get(ev, "data");
  char *s = NULL;
  int rc = -1;
  if (!kind)
    kind = "";
  if (strcmp(kind, "inbox/received") == 0) {
    return content_text(json_object_get(d, "content"));
  } else if (strcmp(kind, "inbox/claimed") == 0) {
    rc = asprintf(&s, "message %s", ah__cli_jstr(ev, "messageId") ? ah__cli_jstr(ev, "messageId") : "?");
  } else if (strcmp(kind, "turn/started") == 0) {
    rc = asprintf(&s, "%s%s%s", ah__cli_jstr(d, "provider") ? ah__cli_jstr(d, "provider") : "?",
                  ah__cli_jstr(d, "model") ? " " : "",
                  ah__cli_jstr(d, "model") ? ah__cli_jstr(d, "model") : "");
  } else if (strcmp(kind, "message/committed") == 0) {
    rc = asprintf(&s, "%s: %s", ah__cli_jstr(d, "role") ? ah__cli_jstr(d, "role") : "?",
                  ah__cli_jstr(d, "text") ? ah__cli_jstr(d, "text") : "");
  } else if (strcmp(kind, "turn/ended") == 0) {
    rc = asprintf(&s, "%s%s%s", ah__cli_jstr(d, "reason") ? ah__cli_jstr(d, "reason") : "?",
                  ah__cli_jstr(d, "error") ? ": " : "",
                  ah__cli_jstr(d, "error") ? ah__cli_jstr(d, "error") : "");
  } else if (strcmp(kind, "tool/call") == 0 || strcmp(kind, "tool/result") == 0) {
    const json_t *more = json_object_get(d, strcmp(kind, "tool/call") == 0 ? "args" : "result");
    char *j = more ? json_dumps(more, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    rc = asprintf(&s, "%s%s %s", ah__cli_jstr(d, "name") ? ah__cli_jstr(d, "name") : "?",
                  json_is_true(json_object_get(d, "isError")) ? " (error)" : "", j ? j : "");
    free(j);
  } else if (strcmp(kind, "tool/approval") == 0) {
    rc = asprintf(&s, "%s: %s", ah__cli_jstr(d, "name") ? ah__cli_jstr(d, "name") : "?",
                  ah__cli_jstr(d, "outcome") ? ah__cli_jstr(d, "outcome") : "?");
  } else if (strcmp(kind, "question/asked") == 0 && ah__cli_jstr(d, "question")) {
    rc = asprintf(&s, "%s", ah__cli_jstr(d, "question"));
  } else if (strcmp(kind, "subagent/started") == 0 || strcmp(kind, "subagent/finished") == 0) {
    const char *more = ah__cli_jstr(d, strcmp(kind, "subagent/started") == 0 ? "prompt" : "reason");
    rc = asprintf(&s, "%s: %s", ah__cli_jstr(d, "sessionId") ? ah__cli_jstr(d, "sessionId") : "?",
                  more ? more : "");
  } else if (strcmp(kind, "hook/ran") == 0) {
    const char *why = ah__cli_jstr(d, "reason") ? ah__cli_jstr(d, "reason") : ah__cli_jstr(d, "error");
    rc = asprintf(&s, "%s (%s%s%s): %s%s%s", ah__cli_jstr(d, "hook") ? ah__cli_jstr(d, "hook") : "?",
                  ah__cli_jstr(d, "event") ? ah__cli_jstr(d, "event") : "?",
                  ah__cli_jstr(d, "tool") ? " " : "", ah__cli_jstr(d, "tool") ? ah__cli_jstr(d, "tool") : "",
                  ah__cli_jstr(d, "outcome") ? ah__cli_jstr(d, "outcome") : "?", why ? ": " : "",
                  why ? why : "");
  } else if (strcmp(kind, "agent/error") == 0 && ah__cli_jstr(d, "message")) {
    rc = asprintf(&s, "%s", ah__cli_jstr(d, "message"));
  }
  if (rc >= 0)
    return s;
  s = d ? json_dumps(d, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  return s ? s : strdup("");
}

static int sessions_show(cli_store *r, const char *id, bool as_json) {
  json_t *row = ah__store_get_session(r->store, id);
  if (!row) {
    char *e = ah__cli_esc(id, 80);
    fprintf(stderr, "agenthost: sessions show: no such session: %s\n", e);
    free(e);
    return 1;
  }
  json_t *session = cli_row(row);
  json_decref(row);
  json_t *events = all_events(r, id);
  if (!events) {
    fprintf(stderr, "agenthost: sessions show: the store could not be read\n");
    json_decref(session);
    return 1;
  }
  if (as_json) {
    json_t *out = json_pack("{s:o, s:o}", "session", session, "events", events);
    print_json(out);
    json_decref(out);
    return flush_out("sessions show");
  }
  static const char *const fields[] = {"id",    "title",  "status",  "cwd",     "provider",
                                       "model", "parent", "created", "updated", "lastSeq"};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const json_t *v = json_object_get(session, fields[i]);
    char *text = json_is_string(v)       ? strdup(json_string_value(v))
                 : v && !json_is_null(v) ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)
                                         : strdup("-");
    char *e = ah__cli_esc(text, 0);
    printf("%-9s %s\n", fields[i], e);
    free(e);
    free(text);
  }
  printf("\n%6s  %-24s  %-18s  %s\n", "SEQ", "TIME", "KIND", "SUMMARY");
  size_t i = 0;
  json_t *ev = NULL;
  json_array_foreach(events, i, ev) {
    char *time = ah__cli_esc(ah__cli_jstr(ev, "time"), 0);
    char *kind = ah__cli_esc(ah__cli_jstr(ev, "kind"), 0);
    char *raw = event_summary(ev);
    char *summary = ah__cli_esc(raw, 80);
    printf("%6lld  %-24s  %-18s  %s\n", (long long)json_integer_value(json_object_get(ev, "seq")), time, kind,
           summary);
    free(time);
    free(kind);
    free(raw);
    free(summary);
  }
  json_decref(session);
  json_decref(events);
  return flush_out("sessions show");
}

static int sessions_export(cli_store *r, const char *id) {
  json_t *row = ah__store_get_session(r->store, id);
  if (!row) {
    char *e = ah__cli_esc(id, 80);
    fprintf(stderr, "agenthost: sessions export: no such session: %s\n", e);
    free(e);
    return 1;
  }
  json_decref(row);
  /* Page by page, so a long session is never held whole; the lines are exactly session.export's. */
  int64_t after = 0;
  for (;;) {
    json_t *page = ah__store_events(r->store, id, after, 1000);
    if (!page) {
      fprintf(stderr, "agenthost: sessions export: the store could not be read\n");
      return 1;
    }
    size_t i = 0;
    json_t *ev = NULL;
    json_array_foreach(page, i, ev) {
      json_dumpf(ev, stdout, JSON_COMPACT);
      fputc('\n', stdout);
      after = json_integer_value(json_object_get(ev, "seq"));
    }
    size_t n = json_array_size(page);
    json_decref(page);
    if (n < 1000)
      break;
  }
  return flush_out("sessions export");
}

int ah__cli_sessions(const ah_config *cfg, const char *sub, const char *id, bool as_json) {
  char what[32];
  snprintf(what, sizeof what, "sessions %s", sub);
  cli_store r;
  memset(&r, 0, sizeof r);
  if (store_open(cfg, what, &r, true) != 0)
    return 1;
  int code = strcmp(sub, "list") == 0   ? sessions_list(&r, as_json)
             : strcmp(sub, "show") == 0 ? sessions_show(&r, id, as_json)
                                        : sessions_export(&r, id);
  store_close(&r);
  return code;
}

/* ---- sessions delete: through the running daemon (its tabs drop the session), else the store itself ---- */

typedef struct delete_wait {
  bool done;
  int status;
} delete_wait;

static void deleted(int status, const json_t *results, void *arg) {
  (void)results;
  delete_wait *d = arg;
  d->done = true;
  d->status = status;
}

int ah__cli_sessions_delete(const ah_config *cfg, const char *id) {
  char *e = ah__cli_esc(id, 80);
  json_t *result = NULL, *error = NULL;
  int rc = ah__admin_call(cfg->runtime_dir, "session.delete", json_pack("{s:s}", "sessionId", id), 30000,
                          &result, &error);
  int code = 0;
  if (rc == 0) {
    printf("deleted %s\n", e);
  } else if (error || rc != AH_ECLOSED) {
    const char *msg = json_string_value(json_object_get(error, "message"));
    fprintf(stderr, "agenthost: sessions delete: %s: %s\n", e, msg ? msg : ah_strerror(rc));
    if (rc == AH_EBUSY)
      fprintf(stderr, "(to close it: agenthost call session.close '{\"sessionId\": \"%s\"}')\n", e);
    code = 1;
  } else {
    /* No daemon answers: the store, written here. */
    cli_store r;
    memset(&r, 0, sizeof r);
    if (store_open(cfg, "sessions delete", &r, false) != 0) {
      free(e);
      return 1;
    }
    json_t *row = ah__store_get_session(r.store, id);
    if (!row) {
      fprintf(stderr, "agenthost: sessions delete: no such session: %s\n", e);
      code = 1;
    } else if (!json_is_true(json_object_get(row, "closed"))) {
      fprintf(stderr, "agenthost: sessions delete: %s: the session is open: close it first\n", e);
      fprintf(stderr, "(with the daemon running: agenthost call session.close '{\"sessionId\": \"%s\"}')\n",
              e);
      code = 1;
    } else {
      delete_wait d = {0};
      int w =
          ah__store_write(r.store, json_pack("[{s:s, s:s}]", "op", "session.delete", "id", id), deleted, &d);
      while (w == 0 && !d.done && uv_run(&r.loop, UV_RUN_ONCE))
        ;
      if (w || d.status) {
        fprintf(stderr, "agenthost: sessions delete: %s: %s\n", e, ah_strerror(w ? w : d.status));
        code = 1;
      } else {
        printf("deleted %s (no daemon is running: from the store)\n", e);
      }
    }
    json_decref(row);
    store_close(&r);
  }
  json_decref(result);
  json_decref(error);
  free(e);
  return code;
}
